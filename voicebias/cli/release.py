"""`voicebias release OUT` and `voicebias replicate BUNDLE`: release bundles and their replication.

A release bundle is a folder a reader can check without calling any system: the stimuli (with
their audio), the raw replies (tables and audio), the scores, the analysis tables, the audit card,
the params, dvc.lock and the system cards, plus `MANIFEST.json` (every file's sha256) and
`DATASHEET.md` (the questions of Gebru et al., 2021, "Datasheets for Datasets", answered from the
run). Share it with `dvc add OUT && dvc push` (or any file store): it is plain files.

`replicate(bundle)` checks it in five steps and returns one :class:`Check` per file or table:

1. every file is there with the sha256 the manifest gives (an edited or missing file is named);
2. the text scores are derived again from the replies' transcripts (voicebias.scoring.text) and
   compared with the bundle's `data/scored/<system>.csv`;
3. the speech-to-speech analysis is run again on those scores (voicebias.pipeline.analysis, the
   bundle's acoustic scores and planted truth as given) and every table of
   `reports/analysis/` is compared with the bundle's;
4. the S2S paper's published figures are compared with the re-derived tables, for the paper's
   systems the bundle holds, each within the rounding of its print (voicebias.analysis.published);
5. the audit card is built again from the re-derived tables and compared with the bundle's
   (voicebias.cli.compare.compare_cards).

Tables agree when they have the same columns and rows, text cells are equal and numbers are
equal within a relative tolerance (`rtol`, default 1e-6: the same code on another machine; see
docs/reproducibility.md). The acoustic measures of the replies and the speech-continuation study
are checked by their hashes (step 1), not measured again.

`voicebias replicate` prints one PASS/FAIL line per check and exits 1 when any fails.
docs/reproducibility.md, "Releasing an audit and replicating it".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from voicebias import config
from voicebias.errors import ConfigError, NotFound

#: what a bundle holds, relative to the repository root (files and folders; absent ones are skipped)
BUNDLE_PATHS = (
    "params.yaml",
    "dvc.lock",
    "models/cards",
    "data/passages/passages.csv",
    "data/stimuli",
    "data/responses",
    "data/scored",
    "data/replicates",
    "reports/respond",
    "reports/carrier_gate",
    "reports/phonation/check_metrics.json",
    "reports/analysis",
    "reports/psychometric",
    "reports/sc",
    "reports/usage",
    "reports/replicates",
    "reports/disaggregated/disaggregated.csv",
    "reports/report/audit_card.json",
    "reports/report/audit_card.md",
)
MANIFEST = "MANIFEST.json"
#: the disaggregated table, whose item intervals the card shows beside the replicates' spread
DISAGGREGATED = "reports/disaggregated/disaggregated.csv"
DATASHEET = "DATASHEET.md"
#: the relative tolerance on numbers when a table is compared with the bundle's
DEFAULT_RTOL = 1e-6


@dataclass
class Check:
    """One replication check: what was compared, whether it agrees, and where it does not."""

    what: str
    ok: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.what}" + (f": {self.detail}" if self.detail else "")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path, rel: str) -> list[str]:
    path = root / rel
    if path.is_file():
        return [rel]
    if path.is_dir():
        return sorted(p.relative_to(root).as_posix() for p in path.rglob("*") if p.is_file() and p.name != ".gitignore")
    return []


def release(root: Path, out: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Write the bundle of the run in `root` to `out` (which must not exist or be empty): the files
    of :data:`BUNDLE_PATHS`, MANIFEST.json and DATASHEET.md. Returns the manifest."""
    root, out = Path(root), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; name a new folder for the release")
    if not (root / "reports" / "report" / "audit_card.json").exists():
        raise NotFound(f"no audit card in {root} (reports/report/audit_card.json): run `dvc repro` first")
    files: dict[str, str] = {}
    for rel in BUNDLE_PATHS:
        for f in _files(root, rel):
            dst = out / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / f, dst)
            files[f] = _sha256(dst)
    (out / DATASHEET).write_text(datasheet(out, params), encoding="utf-8")
    files[DATASHEET] = _sha256(out / DATASHEET)
    manifest = {"format": "voicebias release 1", "files": dict(sorted(files.items()))}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def datasheet(bundle: Path, params: dict[str, Any]) -> str:
    """DATASHEET.md of a bundle: the questions of "Datasheets for Datasets" (Gebru et al., 2021)
    answered from the bundle's own files (counts, voices, systems, tasks, cards)."""
    from voicebias.io import read_json, read_table

    stimuli = read_table(bundle / "data" / "stimuli" / "manifest.csv")
    card = read_json(bundle / "reports" / "report" / "audit_card.json")
    systems = list(params["run"]["systems"])
    tasks = list(params["tasks"]["names"])
    replies = {
        s: sum(len(read_table(p)) for p in sorted((bundle / "data" / "responses" / s).glob("*/responses.csv")))
        for s in systems
    }
    voices = sorted(set(stimuli.get("voice_id", pd.Series(dtype=str)).dropna().astype(str)))
    cards = {}
    for s in systems + list(params["run"].get("sc_systems") or []):
        path = bundle / "models" / "cards" / f"{s}.yaml"
        if path.exists():
            from voicebias.io import read_yaml

            c = read_yaml(path)
            cards[s] = (c.get("checkpoint"), c.get("revision"), c.get("licence"))
    per_lang = stimuli.groupby("lang").size().to_dict() if "lang" in stimuli else {}
    lines = [
        "# Datasheet",
        "",
        "The questions of Gebru et al. (2021), *Datasheets for Datasets*, answered for this release of a",
        "voicebias audit. Every number below is read from the files of the bundle (MANIFEST.json lists them).",
        "",
        "## Motivation",
        "",
        "- **Purpose.** An audit of gender bias in speech models: whether a speech-to-speech model decides",
        "  who is speaking from the voice or from a stereotype in the words, and whether speech-continuation",
        "  models treat voices differently by gender (docs/README.md of voicebias).",
        f"- **Profile.** `{params['base']['profile']}`; seed {params['base']['seed']}.",
        "",
        "## Composition",
        "",
        f"- **Stimuli.** {len(stimuli)} voiced passages ("
        + ", ".join(f"{lang}: {n}" for lang, n in sorted(per_lang.items()))
        + f"), read by {len(voices)} voices: {', '.join(voices)}.",
        f"- **Tasks.** {', '.join(tasks)}.",
        "- **Replies.** " + "; ".join(f"{s}: {n} rows" for s, n in replies.items()) + ".",
        "- **Systems.** " + "; ".join(f"{s}: {ck} at {rev} ({lic})" for s, (ck, rev, lic) in cards.items()) + ".",
        "- **Personal information.** None: the voices are synthetic (the TTS backend's catalogue voices);",
        "  the passages are written for the audit.",
        "",
        "## Collection process",
        "",
        f"- **Voicing.** TTS backend `{params['tts']['backend']}` (data/stimuli/backend.json), checked by",
        f"  the carrier gate (reports/carrier_gate; verdict: {card['checks']['carrier_gate']['verdict']}).",
        "- **Replies.** Each system answered every stimulus of every task through voicebias's runner;",
        "  failed calls are recorded as failed, never filled in (reports/respond, reports/analysis/compliance.csv).",
        "",
        "## Preprocessing, cleaning, labelling",
        "",
        "- **Scores.** Describe words and pronouns from the transcripts (data/scored/<system>.csv), acoustic",
        "  measures of the output audio (data/scored/<system>_acoustics.csv); exclusions are counted with",
        "  their reasons (reports/analysis/exclusions.csv).",
        "",
        "## Uses",
        "",
        "- **Intended.** Checking and extending the audit's tables: `voicebias replicate` re-derives the",
        "  scores, the analysis tables and the audit card from the replies alone, with no system call.",
        "- **Not intended.** Training speaker or gender classifiers; judging people.",
        "",
        "## Distribution",
        "",
        "- **Form.** Plain files with their sha256 in MANIFEST.json; shared with `dvc add` and `dvc push`.",
        "- **Licences.** The systems' outputs fall under each system's licence (above); the passages and",
        "  the code under voicebias's.",
        "",
        "## Maintenance",
        "",
        "- **Errata.** A corrected run is a new release; `voicebias compare` lists what changed between",
        "  two audit cards.",
        "",
    ]
    return "\n".join(lines)


def _plain(v: Any) -> Any:
    """A table cell as a Python value (a numpy scalar shown as its number)."""
    return v.item() if hasattr(v, "item") else v


def compare_tables(got: pd.DataFrame, want: pd.DataFrame, rtol: float = DEFAULT_RTOL) -> str | None:
    """None when the tables agree (same columns, rows, text, numbers within rtol), else where not."""
    if list(got.columns) != list(want.columns):
        return f"columns differ: {sorted(set(got.columns) ^ set(want.columns)) or 'their order'}"
    if len(got) != len(want):
        return f"{len(want)} rows in the bundle, {len(got)} derived"
    for col in want.columns:
        a, b = got[col], want[col]
        an, bn = pd.to_numeric(a, errors="coerce"), pd.to_numeric(b, errors="coerce")
        numeric = an.notna().eq(a.notna()).all() and bn.notna().eq(b.notna()).all()
        if numeric:
            x, y = an.to_numpy(float), bn.to_numpy(float)
            same = np.isclose(x, y, rtol=rtol, atol=1e-12, equal_nan=True)
        else:
            same = (a.astype(str).where(a.notna(), None) == b.astype(str).where(b.notna(), None)).to_numpy() | (
                a.isna() & b.isna()
            ).to_numpy()
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            n = int((~same).sum())
            old, new = _plain(b.iloc[i]), _plain(a.iloc[i])
            return f"{n} cell(s) of {col!r} differ, first row {i}: bundle {old!r}, derived {new!r}"
    return None


def replicate(bundle: Path, rtol: float = DEFAULT_RTOL, workdir: Path | None = None) -> list[Check]:
    """The checks of the module docstring, in order, one per file group or table."""
    from voicebias.analysis.published import check_published
    from voicebias.cli.compare import compare_cards
    from voicebias.io import read_json, read_table, read_yaml, write_table
    from voicebias.pipeline.analysis import run_stage as run_analysis
    from voicebias.pipeline.report import replicate_spread
    from voicebias.report.card import audit_card
    from voicebias.scoring.text import score_responses

    bundle = Path(bundle)
    if not (bundle / MANIFEST).exists():
        raise NotFound(f"{bundle} has no {MANIFEST}: not a voicebias release bundle")
    manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    checks: list[Check] = []
    bad = [f for f, sha in manifest["files"].items() if not (bundle / f).is_file() or _sha256(bundle / f) != sha]
    checks.append(
        Check(
            f"files ({len(manifest['files'])} listed in {MANIFEST})",
            not bad,
            ("changed or missing: " + ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""))
            if bad
            else "",
        )
    )
    params = read_yaml(bundle / "params.yaml")
    systems, tasks = list(params["run"]["systems"]), list(params["tasks"]["names"])
    with tempfile.TemporaryDirectory(prefix="voicebias-replicate-", dir=workdir) as tmp:
        tmp = Path(tmp)
        scored_paths = []
        for s in systems:
            parts = [read_table(bundle / "data" / "responses" / s / t / "responses.csv") for t in tasks]
            scored = score_responses(pd.concat(parts, ignore_index=True))
            path = tmp / "scored" / f"{s}.csv"
            write_table(path, scored)
            scored_paths.append(path)
            diff = compare_tables(read_table(path), read_table(bundle / "data" / "scored" / f"{s}.csv"), rtol)
            checks.append(Check(f"data/scored/{s}.csv (from the replies' transcripts)", diff is None, diff or ""))
        run_analysis(
            params,
            scored_paths=scored_paths,
            acoustic_paths=[bundle / "data" / "scored" / f"{s}_acoustics.csv" for s in systems],
            planted_truth_paths={s: bundle / "reports" / "respond" / s / "planted_truth.json" for s in systems},
            out_dir=tmp / "analysis",
        )
        for want in sorted((bundle / "reports" / "analysis").glob("*.csv")):
            got = tmp / "analysis" / want.name
            diff = "not derived" if not got.exists() else compare_tables(read_table(got), read_table(want), rtol)
            checks.append(Check(f"reports/analysis/{want.name}", diff is None, diff or ""))
        for fig in check_published(tmp / "analysis"):
            lo, hi = fig["accepted"]
            got = fig["why"] or f"{fig['value']:.4g}"
            checks.append(
                Check(
                    f"{fig['where']}: {fig['says']}",
                    fig["ok"],
                    f"this bundle {got}, accepted [{lo:g}, {hi:g}]",
                )
            )
        card = read_json(bundle / "reports" / "report" / "audit_card.json")

        def optional(rel: str, read: Any) -> Any:
            return read(bundle / rel) if (bundle / rel).exists() else None

        again = audit_card(
            tmp / "analysis",
            bundle / "reports" / "sc" if (bundle / "reports" / "sc").is_dir() else None,
            read_json(bundle / "reports" / "carrier_gate" / "metrics.json"),
            optional("reports/phonation/check_metrics.json", read_json),
            card["provenance"],
            voices=card.get("voices"),
            psychometric=optional("reports/psychometric/psychometric.csv", read_table),
            usage=optional("reports/usage/usage.csv", read_table),
            determinism={d["system"]: d["tasks"] for d in card.get("determinism") or []},
            samples_per_item=int(params["run"].get("samples_per_item", 1)),
            replicates=replicate_spread(
                params, lambda s: bundle / "reports" / "replicates" / s, bundle / DISAGGREGATED
            ),
        )
        again = json.loads(json.dumps(again, allow_nan=True))
        diffs = compare_cards(card, again, rtol)
        checks.append(
            Check(
                "reports/report/audit_card.json (built again from the derived tables)",
                not diffs,
                "; ".join(d.path for d in diffs[:5]) + (f" and {len(diffs) - 5} more" if len(diffs) > 5 else ""),
            )
        )
    return checks


def cmd_release(args: argparse.Namespace) -> int:
    from voicebias.params import load_params

    out = Path(args.out).resolve()
    manifest = release(config.ROOT, out, load_params())
    print(f"voicebias release: {len(manifest['files'])} files in {out} ({MANIFEST}, {DATASHEET})")
    print(f"  share it: dvc add {args.out} && dvc push   (or any file store)")
    print(f"  check it: voicebias replicate {args.out}")
    return 0


def cmd_replicate(args: argparse.Namespace) -> int:
    checks = replicate(Path(args.bundle), rtol=args.rtol)
    for c in checks:
        print(c.line())
    failed = [c for c in checks if not c.ok]
    if not any(c.what.startswith("S2S paper") for c in checks):
        print("(the S2S paper's published figures: this bundle audits none of the paper's five systems)")
    print(f"voicebias replicate: {len(checks) - len(failed)} of {len(checks)} checks pass")
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `release` and `replicate` on the command's subparsers."""
    p = sub.add_parser("release", help="write a bundle of this run a reader can replicate without system calls")
    p.add_argument("out", help="a new (or empty) folder for the bundle")
    p.set_defaults(fn=cmd_release)
    p = sub.add_parser("replicate", help="re-derive a bundle's scores, tables and card from its replies; PASS/FAIL")
    p.add_argument("bundle", help="the bundle's folder (voicebias release OUT)")
    p.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance on numbers (default 1e-6)")
    p.set_defaults(fn=cmd_replicate)


__all__ = ["Check", "add_parser", "cmd_release", "cmd_replicate", "compare_tables", "datasheet", "release", "replicate"]
