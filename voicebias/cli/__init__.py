"""The `voicebias` command: what users do besides `dvc repro`.

Subcommands: preflight (what the active profile still needs, in plain words), profile, systems,
tasks, bank render|lint, analyze (describe, summarize, rq1, sc and phonation statistics from a
table alone), measure (acoustic measures of any audio files), fetch (the hub weights the system
cards list), serve (servers of open systems outside DVC), compare (two audits' cards), verify (this
checkout's outputs against a revision's), ui (the MLflow UI command) and dev deps (every stage's
code deps in dvc.yaml). The larger ones live in their own modules of voicebias.cli.

Every command, what it does and where it is documented: docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from voicebias import config
from voicebias.cli import canary, compare, dev, fetch, measure, release, serve, verify
from voicebias.errors import ConfigError, guarded
from voicebias.params import load_params


def _print(df: pd.DataFrame) -> None:
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(df.to_string(index=False))


def cmd_preflight(args: argparse.Namespace) -> int:
    from voicebias.cli.preflight import format_checks, preflight
    from voicebias.cli.profiles import resolve_profile
    from voicebias.params import validate_params

    if args.profile:
        params = validate_params(resolve_profile(args.profile), source=f"profile '{args.profile}'")
    else:
        params = load_params()
    if args.estimate:
        from voicebias.cli.estimate import estimate, format_estimate
        from voicebias.config import ROOT

        table = estimate(params, ROOT)
        print(format_estimate(table, str(params["base"]["profile"])))
        return 0
    checks = preflight(params)
    print(format_checks(checks))
    return 0 if all(c.ok for c in checks) else 1


def cmd_profile(args: argparse.Namespace) -> int:
    from voicebias.cli.profiles import write_profile

    path = write_profile(args.name)
    print(f"params.yaml now holds the '{args.name}' profile ({path}); run `voicebias preflight` next.")
    return 0


def cmd_systems(args: argparse.Namespace) -> int:
    from voicebias.cards import load_card
    from voicebias.systems.catalog import ADAPTERS

    params = load_params()
    rows = []
    for name in list(params["run"]["systems"]) + list(params["run"].get("sc_systems") or []):
        card = load_card(name)
        rows.append(
            {
                "system": name,
                "kind": card.get("kind", "s2s"),
                "adapter": card["adapter"],
                "available": card["adapter"] in ADAPTERS,
                "checkpoint": card.get("checkpoint", ""),
                "licence": card["licence"],
            }
        )
    _print(pd.DataFrame(rows))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from voicebias.tasks import load_tasks

    rows = [
        {"task": t.name, "languages": ",".join(t.languages()), "output": t.output_lang, "role": t.role}
        for t in load_tasks().values()
    ]
    _print(pd.DataFrame(rows))
    return 0


def _load_scored(path: str) -> pd.DataFrame:
    from voicebias.io import read_table
    from voicebias.scoring.text import score_responses

    df = read_table(Path(path)) if not str(path).endswith(".parquet") else pd.read_parquet(path)
    needed = {"system", "task", "lang", "pole", "voice_gender"}
    missing = needed - set(df.columns)
    if missing:
        raise ConfigError(f"{path}: missing contract columns {sorted(missing)}")
    if "status" not in df:
        df["status"] = "ok"
    if "judged_gender" not in df or "pronoun_choice" not in df:
        if "transcript" not in df:
            raise ConfigError(f"{path}: needs judged_gender/pronoun_choice or a transcript column to score")
        if "target_lang" not in df:
            df["target_lang"] = [("en" if t == "translate" else lang) for t, lang in zip(df["task"], df["lang"])]
        df = score_responses(df)
    return df


def _read_any(path: str) -> pd.DataFrame:
    if not Path(path).exists():
        raise FileNotFoundError(f"table not found: {path}")
    return pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)


def _require(df: pd.DataFrame, cols: set[str], what: str) -> None:
    missing = sorted(cols - set(df.columns))
    if missing:
        raise ConfigError(f"{what}: missing columns {missing}")


def _analyze_other(args: argparse.Namespace) -> dict[str, pd.DataFrame]:
    if args.what == "rq1":
        from voicebias.analysis.rq1 import rq1_tables

        df = pd.concat([_read_any(t) for t in args.table], ignore_index=True)
        _require(df, {"system", "task", "lang", "pole", "voice_gender", "passage_id", "delta_composite"}, "rq1 table")
        return rq1_tables(df, args.confidence)
    if args.what == "sc":
        from voicebias.analysis.sc import analyse
        from voicebias.contract import SC_MEASURES

        if not args.prompt_measures:
            raise ConfigError("analyze sc needs --prompt-measures (the manipulation check's measures.csv)")
        df = pd.concat([_read_any(t) for t in args.table], ignore_index=True)
        _require(
            df,
            {
                "system",
                "stimulus_id",
                "prompt_id",
                "voice_gender",
                "phonation",
                "status",
                "speaker_similarity",
                *SC_MEASURES,
                "judge_status",
            },
            "scored continuation table",
        )
        return analyse(df, _read_any(args.prompt_measures))
    from voicebias.gates.phonation_check import paired_changes, summarise
    from voicebias.stimuli.phonation.presets import presets_from_params

    df = _read_any(args.table[0])
    _require(df, {"stimulus_id", "source_stimulus_id", "phonation", "voice_id", "measure_status"}, "phonation measures")
    presets = presets_from_params(load_params().get("phonation"))
    sims = (
        df[["stimulus_id", "speaker_similarity"]]
        if "speaker_similarity" in df
        else pd.DataFrame(columns=["stimulus_id", "speaker_similarity"])
    )
    between_path = Path(args.table[0]).with_name("between_voice_similarity.csv")
    between = (
        _read_any(str(between_path))
        if between_path.exists()
        else pd.DataFrame(columns=["prompt_id", "voice_gender", "voice_id", "other_voice_id", "between_similarity"])
    )
    return {"manipulation_check": summarise(paired_changes(df, presets), sims.dropna(), between, df)}


def cmd_analyze(args: argparse.Namespace) -> int:
    from voicebias.analysis.s2s import describe_misgender, describe_odds_ratios, summarize_pronouns
    from voicebias.io import write_table

    if args.what in ("rq1", "sc", "phonation"):
        tables = _analyze_other(args)
    else:
        if len(args.table) != 1:
            raise ConfigError(f"analyze {args.what} takes one table")
        df = _load_scored(args.table[0])
        if args.what == "describe":
            tables = {"describe_odds_ratios": describe_odds_ratios(df, args.confidence)}
            tables["describe_misgender"], tables["describe_fisher"] = describe_misgender(df, args.confidence)
        else:
            tables = {"summarize_pronouns": summarize_pronouns(df)}
    for name, t in tables.items():
        print(f"\n== {name}")
        _print(t)
        if args.out:
            write_table(Path(args.out) / f"{name}.csv", t)
    return 0


def cmd_bank(args: argparse.Namespace) -> int:
    from voicebias.stimuli.bank import main as bank_main

    argv = (
        [args.action]
        + [x for lang in (args.lang or []) for x in ("--lang", lang)]
        + (["--out", args.out] if args.out else [])
    )
    return bank_main(argv)


def cmd_ui(args: argparse.Namespace) -> int:
    from voicebias.report.tracking import no_telemetry, tracking_uri

    uri = tracking_uri(load_params())
    telemetry = f"MLFLOW_DISABLE_TELEMETRY={no_telemetry()}"
    cmd = [
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--workers",
        "1",
    ]
    print(telemetry, " ".join(cmd))
    # MLflow's UI opens an experiment on its GenAI overview unless the address names the workflow type
    last = config.TRACKING_MARKER.with_name("last_run.json")
    if last.exists():
        from voicebias.io import read_json

        marker = read_json(last)
        ui_path = marker.get("ui_path") if isinstance(marker, dict) else None
        if ui_path:
            print(f"then open http://127.0.0.1:{args.port}/{ui_path}  (the runs table of the last pipeline run)")
    if args.run:
        import subprocess

        return subprocess.call(cmd)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `voicebias` command line: every command and its options."""
    ap = argparse.ArgumentParser(prog="voicebias", description="Gender-bias audit of speech models.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight", help="what the active (or named) profile still needs")
    p.add_argument("--profile", help="check a profile without switching to it")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="print the calls, input audio, tokens and cost the profile would send (nothing is sent)",
    )
    p.set_defaults(fn=cmd_preflight)
    p = sub.add_parser("profile", help="write a profile to params.yaml")
    p.add_argument("name")
    p.set_defaults(fn=cmd_profile)
    sub.add_parser("systems", help="systems of the active profile").set_defaults(fn=cmd_systems)
    sub.add_parser("tasks", help="tasks and their languages").set_defaults(fn=cmd_tasks)
    p = sub.add_parser("analyze", help="re-run an analysis on a table with the contract columns")
    p.add_argument("what", choices=["describe", "summarize", "rq1", "sc", "phonation"])
    p.add_argument(
        "table",
        nargs="+",
        help="CSV or Parquet table(s): data/scored/<system>.csv (describe, summarize), "
        "data/scored/<system>_acoustics.csv (rq1), data/sc_scored/<system>.csv (sc), "
        "reports/phonation/measures.csv (phonation)",
    )
    p.add_argument("--prompt-measures", help="sc: the prompts' measures (reports/phonation/measures.csv)")
    p.add_argument("--out", help="folder to write the result tables to")
    p.add_argument("--confidence", type=float, default=0.95)
    p.set_defaults(fn=cmd_analyze)
    p = sub.add_parser("bank", help="render the passage bank for review, or list linter hits")
    p.add_argument("action", choices=["render", "lint"])
    p.add_argument("--lang", action="append")
    p.add_argument("--out")
    p.set_defaults(fn=cmd_bank)
    measure.add_parser(sub)
    fetch.add_parser(sub)
    compare.add_parser(sub)
    canary.add_parser(sub)
    release.add_parser(sub)
    serve.add_parser(sub)
    verify.add_parser(sub)
    dev.add_parser(sub)
    p = sub.add_parser("ui", help="print (or --run) the MLflow UI command, bound to 127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--run", action="store_true")
    p.set_defaults(fn=cmd_ui)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded(args.fn, args, stage=args.command)


if __name__ == "__main__":
    sys.exit(main())
