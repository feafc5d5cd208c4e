"""`voicebias measure AUDIO...`: the acoustic instrument on any audio files.

Each file is read, checked and measured exactly as the pipeline's acoustics stage does it
(voicebias.instruments.acoustics.measure_files, on all cores), refused with the reason codes of
voicebias.audio. `--gender male|female|auto` picks the `acoustics` settings (auto: gender-neutral)
from params.yaml in the working directory, else profiles/embedded.yaml. One CSV row per file, in
the order given (file, status, reason, error, note, then the MEASURE_COLUMNS), to stdout or
`--out`. Exit status 0 when at least one file was measured, 1 when none could be.

See docs/cli.md, "voicebias measure".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from voicebias import config
from voicebias.contract import GENDERS, MEASURE_COLUMNS
from voicebias.errors import ConfigError
from voicebias.io import write_table
from voicebias.params import load_params

if TYPE_CHECKING:
    from voicebias.instruments.acoustics import MeasureSettings

# The instrument (parselmouth, scipy) is imported when the command runs, so that
# registering the command costs the other commands nothing.
GENDER_CHOICES = (*GENDERS, "auto")
#: the columns of the table: the file as given, the region measured (with a TextGrid interval's
#: label and times, s), acoustics.STATUS_COLUMNS, then the measures
TABLE_COLUMNS = ["file", "region", "label", "start_s", "end_s", "status", "reason", "error", "note", *MEASURE_COLUMNS]


def active_params(cwd: Path | None = None) -> tuple[dict[str, Any], str]:
    """The validated parameters and where they came from: params.yaml in `cwd` (default:
    the working directory), else profiles/embedded.yaml."""
    here = Path(cwd) if cwd else Path.cwd()
    local = here / "params.yaml"
    if local.is_file():
        return load_params(local), f"{local}"
    embedded = config.PROFILES_DIR / "embedded.yaml"
    return load_params(embedded), f"{embedded} (no params.yaml in {here})"


def settings_for(acoustics: dict[str, Any], gender: str) -> "MeasureSettings":
    """MeasureSettings.for_gender for 'male'/'female', MeasureSettings.neutral for 'auto'."""
    from voicebias.instruments.acoustics import MeasureSettings

    return MeasureSettings.neutral(acoustics) if gender == "auto" else MeasureSettings.for_gender(acoustics, gender)


def textgrid_for(path: str) -> Path:
    """The TextGrid beside an audio file: same folder and stem, extension .TextGrid."""
    return Path(path).with_suffix(".TextGrid")


def measure_paths(
    paths: list[str],
    settings: "MeasureSettings",
    sample_rate: int,
    workers: int | None = None,
    tier: str | None = None,
) -> pd.DataFrame:
    """One row per path (TABLE_COLUMNS), in the order given (a path given twice is measured twice),
    through measure_files on `workers` processes (default: every core). With `tier`, one row per
    labelled interval of that tier of each file's TextGrid (`textgrid_for`), measured over the
    interval with the whole file as context; a file without a TextGrid or without labelled
    intervals is refused (`no_textgrid`, `no_intervals`), a TextGrid Praat cannot read stops the run."""
    from dataclasses import replace

    from voicebias.instruments.acoustics import measure_files
    from voicebias.instruments.regions import span, textgrid_intervals

    rows: list[dict[str, Any]] = []
    jobs = []
    for i, p in enumerate(paths):
        if tier is None:
            rows.append(
                {"file": p, "region": settings.region, "label": "", "start_s": float("nan"), "end_s": float("nan")}
            )
            jobs.append((str(len(rows) - 1), p, settings))
            continue
        grid = textgrid_for(p)
        if not grid.is_file():
            rows.append(
                {
                    "file": p,
                    "region": "",
                    "label": "",
                    "status": "excluded",
                    "reason": "no_textgrid",
                    "error": f"{p}: no TextGrid at {grid}",
                }
            )
            continue
        intervals = textgrid_intervals(grid, tier)
        if not intervals:
            rows.append(
                {
                    "file": p,
                    "region": "",
                    "label": "",
                    "status": "excluded",
                    "reason": "no_intervals",
                    "error": f"{p}: tier '{tier}' of {grid} has no labelled interval",
                }
            )
        for label, start, end in intervals:
            region = span(start, end)
            rows.append({"file": p, "region": region, "label": label, "start_s": start, "end_s": end})
            jobs.append((str(len(rows) - 1), p, replace(settings, region=region)))
    if jobs:
        measured = measure_files(jobs, sample_rate=sample_rate, workers=workers, desc="measuring")
        for rec in measured.to_dict("records"):
            rows[int(rec.pop("id"))].update(rec)
    table = pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)
    for col in ("region", "label", "reason", "error", "note"):
        table[col] = table[col].fillna("").astype(str)
    return table.reindex(columns=TABLE_COLUMNS)


def _refusal_line(file: str, reason: str, error: str) -> str:
    message = error[len(file) + 2 :] if error.startswith(f"{file}: ") else error
    return f"voicebias measure: {file}: refused ({reason}): {message}"


def cmd_measure(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).is_dir():  # checked first: measuring takes time
        raise ConfigError(
            f"--out {args.out} is a folder; give the CSV file to write, e.g. --out {Path(args.out) / 'measures.csv'}"
        )
    if args.tier:  # every TextGrid is read before anything is measured: one that cannot be read stops the run
        from voicebias.instruments.regions import textgrid_intervals

        for p in args.audio:
            if textgrid_for(p).is_file():
                textgrid_intervals(textgrid_for(p), args.tier)
    params, source = active_params()
    settings = settings_for(params["acoustics"], args.gender)
    if args.region != "whole":
        from dataclasses import replace

        settings = replace(settings, region=args.region)
    sample_rate = int(params["tts"]["sample_rate"])
    what = "gender-neutral settings" if args.gender == "auto" else f"{args.gender} settings"
    print(
        f"voicebias measure: {what} from the acoustics section of {source}; audio read at {sample_rate} Hz",
        file=sys.stderr,
    )
    table = measure_paths(list(args.audio), settings, sample_rate, tier=args.tier)
    refused = table[table["status"] != "ok"]
    for r in refused.itertuples():
        print(_refusal_line(r.file, r.reason, r.error), file=sys.stderr)
    if args.out:
        write_table(Path(args.out), table)
    else:
        table.to_csv(sys.stdout, index=False, float_format="%.10g", lineterminator="\n")
    measured = len(table) - len(refused)
    print(
        f"voicebias measure: measured {measured} of {len(table)} file(s), refused {len(refused)}"
        + (f"; table written to {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0 if measured else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `measure` on the command's subparsers."""
    p = sub.add_parser("measure", help="acoustic measures of any audio files, one row per file")
    p.add_argument("audio", nargs="+", help="audio files (WAV, FLAC, MP3, ... any sample rate)")
    p.add_argument(
        "--gender",
        choices=GENDER_CHOICES,
        default="auto",
        help="analysis settings: male or female (acoustics pitch range and formant ceiling of that "
        "gender) or auto (gender-neutral settings; default)",
    )
    p.add_argument(
        "--region",
        choices=("whole", "voiced", "nucleus", "steady"),
        default="whole",
        help="the part of each file measured: whole (default), voiced (voicing within 6 dB of the loudest), "
        "nucleus (the longest such stretch: a vowel), steady (the first half of the nucleus); docs/accuracy.md",
    )
    p.add_argument(
        "--tier",
        help="measure each labelled interval of this interval tier of the TextGrid beside each file "
        "(same name, .TextGrid), one row per interval",
    )
    p.add_argument("--out", help="write the table to this CSV file instead of stdout")
    p.set_defaults(fn=cmd_measure)
