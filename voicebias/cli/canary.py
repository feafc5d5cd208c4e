"""`voicebias canary [RUN] [--systems S ...] [--task describe] [--items 8] [--min-agreement 1.0]`:
before two runs are compared, check that a model still answers as it did in the earlier one.

RUN is the checkout of the earlier run (default: this one): its responses tables
(data/responses/<system>/<task>/responses.csv) and stimuli (data/stimuli/manifest.csv, with the
audio). For each system, the first `--items` answered requests of `--task` (by cache key) are
rebuilt from the stored rows (the same stimulus audio, prompt, target language and seed) and sent
to the system as this checkout's params and cards configure it, past the cache. Each reply is
compared with the stored one: the transcript (where the stored one came from the system), and the
audio by the sha256 of its FLAC. A system whose agreement is below `--min-agreement`, or whose
calls fail, makes the exit status 1, with one line per request that changed.

docs/systems.md, "Canary: is it still the same model?".
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from voicebias import config
from voicebias.errors import ConfigError, NotFound


def canary(
    run_dir: Path,
    params: dict[str, Any],
    systems: list[str],
    task: str,
    items: int,
    cards_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """One record per system: {system, items, same, failed, changed: [(stimulus_id, what)], key_changed}."""
    from voicebias.io import read_table
    from voicebias.systems.base import S2SRequest, sample_seed
    from voicebias.systems.build import build_from
    from voicebias.systems.runner import RetryPolicy, cache_key, call_with_retries, reply_audio_sha256
    from voicebias.systems.s2s import S2S_ADAPTERS

    run_dir = Path(run_dir)
    manifest_path = run_dir / config.STIMULI_MANIFEST.relative_to(config.ROOT)
    if not manifest_path.exists():
        raise NotFound(f"no stimulus manifest in {run_dir} ({manifest_path}); RUN must be a checkout of the run")
    stimuli = read_table(manifest_path).set_index("stimulus_id", drop=False)
    passages_path = run_dir / "data" / "passages" / "passages.csv"
    context: dict[str, Any] = {"rate_wpm": params["tts"]["rate_wpm"]}
    if passages_path.exists():
        context["passages"] = read_table(passages_path)
    seed = int(params["base"]["seed"])
    out = []
    for name in systems:
        table_path = run_dir / config.responses_dir(name, task).relative_to(config.ROOT) / "responses.csv"
        if not table_path.exists():
            raise NotFound(f"{name}: no {task} responses in {run_dir} ({table_path})")
        table = read_table(table_path)
        rows = table[table["status"] == "ok"].sort_values("cache_key").head(max(0, int(items)))
        sys_params = (params.get("systems") or {}).get(name)
        if sys_params is None:
            raise NotFound(f"params.yaml has no 'systems.{name}' section")
        kw = {"cards_dir": cards_dir} if cards_dir is not None else {}
        system = build_from(
            S2S_ADAPTERS, name, sys_params, stimuli=stimuli.reset_index(drop=True), root=run_dir, **kw, **context
        )
        policy = RetryPolicy.from_params(sys_params)
        record: dict[str, Any] = {"system": name, "items": 0, "same": 0, "failed": 0, "changed": [], "key_changed": 0}
        try:
            for r in rows.to_dict("records"):
                s = stimuli.loc[r["stimulus_id"]]
                sample = int(r["sample"]) if "sample" in r and pd.notna(r.get("sample")) else 0
                req = S2SRequest(
                    stimulus_id=str(r["stimulus_id"]),
                    lang=str(r["lang"]),
                    target_lang=str(r["target_lang"]),
                    task=task,
                    prompt=str(r["prompt"]),
                    audio_path=str(run_dir / s["path"]),
                    audio_sha256=str(s["sha256"]),
                    seed=sample_seed(seed, str(r["stimulus_id"]), sample),
                    sample=sample,
                )
                record["items"] += 1
                if cache_key(system, req) != r["cache_key"]:
                    record["key_changed"] += 1  # the card, params or served facts differ from the run's
                resp, _ = call_with_retries(system, req, policy)
                if resp.status != "ok":
                    record["failed"] += 1
                    record["changed"].append((req.stimulus_id, f"the call failed: {resp.error}"))
                    continue
                what = []
                stored_text = r.get("transcript") if r.get("transcript_source") in (None, "system") else None
                if stored_text is not None and pd.notna(stored_text) and (resp.transcript or None) != stored_text:
                    what.append(f"text {str(stored_text)[:60]!r} -> {str(resp.transcript)[:60]!r}")
                if pd.notna(r.get("output_sha256")) and reply_audio_sha256(resp) != r["output_sha256"]:
                    what.append("audio differs")
                if what:
                    record["changed"].append((req.stimulus_id, "; ".join(what)))
                else:
                    record["same"] += 1
        finally:
            system.close()
        out.append(record)
    return out


def cmd_canary(args: argparse.Namespace) -> int:
    from voicebias.params import load_params

    params = load_params()
    systems = list(args.systems) or list(params["run"]["systems"])
    if not systems:
        raise ConfigError("no systems named and the active profile lists none (run.systems)")
    run_dir = Path(args.run).resolve() if args.run else config.ROOT
    records = canary(run_dir, params, systems, args.task, args.items, cards_dir=config.CARDS_DIR)
    bad = False
    for r in records:
        answered = r["items"] - r["failed"]
        agreement = r["same"] / answered if answered else 0.0
        ok = r["items"] > 0 and r["failed"] == 0 and agreement >= args.min_agreement
        bad |= not ok
        verdict = "same as the run" if ok else "CHANGED" if r["items"] else "nothing to check"
        print(f"{r['system']}: {r['same']} of {r['items']} {args.task} answers the same ({verdict})")
        if r["key_changed"]:
            print(
                f"  note: {r['key_changed']} request(s) key differently now than in the run "
                "(the card, params or served facts changed)"
            )
        for sid, what in r["changed"]:
            print(f"  {sid}: {what}")
    return 1 if bad else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `canary` on the command's subparsers."""
    p = sub.add_parser("canary", help="send a few of an earlier run's requests again: does the model still answer so?")
    p.add_argument("run", nargs="?", help="the checkout of the earlier run (default: this one)")
    p.add_argument("--systems", nargs="*", default=[], help="systems to check (default: run.systems)")
    p.add_argument("--task", default="describe", help="the task whose stored requests are sent (default: describe)")
    p.add_argument("--items", type=int, default=8, help="requests per system (default: 8)")
    p.add_argument(
        "--min-agreement",
        type=float,
        default=1.0,
        help="the share of answers that must come back the same (default: 1.0, all)",
    )
    p.set_defaults(fn=cmd_canary)


__all__ = ["add_parser", "canary", "cmd_canary"]
