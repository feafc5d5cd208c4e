"""Benchmark: the acoustics measurement stage vs openSMILE eGeMAPSv02 on the same files.

Synthesises N stimuli with eSpeak NG (passages of the shipped bank, both voices,
all languages, loudness-normalised 16 kHz FLAC as the stimuli stage writes them),
then times, in one run:

1. voicebias.instruments.acoustics.measure_files in one process: the full measure set (F0,
   F1-F3, formant index, H1-H2, H1-A3 and their corrected forms, CPPS, HNR), the set the SC
   stages measure (no HNR), the set the S2S inputs get (pitch, formants); and the full set
   on every core;
2. openSMILE eGeMAPSv02 functionals (88 features), one process, and with as
   many workers as cores.

Each tool first measures one file untimed (imports, first-call set-up); the one-process
runs of voicebias keep BLAS to one thread. Prints wall times, seconds of audio per
second, the ratios, the cost of each component
of the measure set (one process), and the agreement of
the measures both tools share (median F0, H1-H2) as a cross-check. Not a test:
run it by hand,

    .venv/bin/python benchmarks/bench_measure.py --files 40

See benchmarks/README.md for the numbers measured on the project's machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from voicebias.params import load_params


def synthesise(n_files: int, out_dir: Path) -> pd.DataFrame:
    from voicebias import config
    from voicebias.audio import normalize_rms, resample, write_audio
    from voicebias.stimuli.bank import load_bank
    from voicebias.tts import get_backend

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    voices = params["tts"]["voices"]
    tts = get_backend("espeak", rate_wpm=params["tts"]["rate_wpm"])
    bank = load_bank(config.BANK_DIR)
    # interleave languages and poles so any N covers them evenly
    bank = bank.assign(_k=bank.groupby(["lang"]).cumcount()).sort_values(["_k", "lang"])
    rows = []
    for p in bank.itertuples():
        for gender in ("male", "female"):
            if len(rows) >= n_files:
                return pd.DataFrame(rows)
            x, sr = tts.synthesize(p.text, voices[p.lang][gender])
            x, _ = normalize_rms(resample(x, sr, 16000), params["tts"]["target_rms_dbfs"])
            path = out_dir / f"{p.passage_id}-{gender}.flac"
            write_audio(path, x, 16000)
            rows.append(
                {
                    "id": path.stem,
                    "path": str(path),
                    "lang": p.lang,
                    "voice_gender": gender,
                    "duration_s": len(x) / 16000,
                }
            )
    return pd.DataFrame(rows)


def component_costs(files: pd.DataFrame, params: dict) -> pd.DataFrame:
    """Mean seconds per file of each component of the measure set, in one process."""
    from voicebias.audio import load_for_analysis
    from voicebias.instruments import acoustics as ac

    totals = {c: 0.0 for c in ac.COMPONENTS}
    for r in files.itertuples():
        settings = ac.MeasureSettings.for_gender(params, r.voice_gender)
        loaded = load_for_analysis(r.path, target_sr=16000, checks=settings.checks())
        a = ac._Analysis(loaded.x, loaded.sr, settings)
        for c in ac.MEASURE_SET:
            t = time.perf_counter()
            c.measure(a)
            totals[c.name] += time.perf_counter() - t
    return pd.DataFrame(
        [{"component": c, "s_per_file": v / len(files), "share": v / sum(totals.values())} for c, v in totals.items()]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=40, help="number of stimuli to synthesise (default 40)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: every core)")
    ap.add_argument("--keep", type=Path, default=None, help="folder to keep the audio in (default: a temp folder)")
    args = ap.parse_args()

    import opensmile

    from voicebias import config
    from voicebias.contract import SC_COMPONENTS
    from voicebias.instruments.acoustics import MeasureSettings, measure_files

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")["acoustics"]
    tmp = tempfile.TemporaryDirectory()
    out_dir = args.keep or Path(tmp.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    files = synthesise(args.files, out_dir)
    audio_s = float(files["duration_s"].sum())
    print(f"synthesised {len(files)} files, {audio_s:.0f} s of audio, in {time.perf_counter() - t:.1f} s")

    jobs = [(r.id, r.path, MeasureSettings.for_gender(params, r.voice_gender)) for r in files.itertuples()]
    runs = [
        ("full measure set", None, 1),
        ("SC stages' set (no HNR)", SC_COMPONENTS, 1),
        ("S2S inputs' set (pitch, formants)", ("pitch", "formants"), 1),
        (f"full measure set, {args.workers} processes", None, args.workers),
    ]
    from threadpoolctl import threadpool_limits

    # one file through each tool first, untimed: imports and first-call set-up are not
    # per-file costs; and one BLAS thread in the one-process runs, as openSMILE uses one
    measure_files(jobs[:1], 16000, workers=1)
    rows, ours = [], None
    for label, components, workers in runs:
        with threadpool_limits(limits=1 if workers == 1 else None, user_api="blas"):
            t = time.perf_counter()
            out = measure_files(jobs, 16000, workers=workers, desc=label, components=components).set_index("id")
            rows.append({"extractor": f"voicebias: {label}", "wall_s": time.perf_counter() - t})
        ours = out if components is None and ours is None else ours

    smile = opensmile.Smile(
        feature_set=opensmile.FeatureSet.eGeMAPSv02, feature_level=opensmile.FeatureLevel.Functionals
    )
    smile.process_file(files["path"].iloc[0])
    t = time.perf_counter()
    ref = smile.process_files(list(files["path"]))
    t_smile1 = time.perf_counter() - t
    smile_n = opensmile.Smile(
        feature_set=opensmile.FeatureSet.eGeMAPSv02,
        feature_level=opensmile.FeatureLevel.Functionals,
        num_workers=args.workers,
        multiprocessing=True,
    )
    t = time.perf_counter()
    smile_n.process_files(list(files["path"]))
    t_smilen = time.perf_counter() - t
    rows += [
        {"extractor": "openSMILE eGeMAPSv02 functionals (1 process)", "wall_s": t_smile1},
        {"extractor": f"openSMILE eGeMAPSv02 functionals ({args.workers} processes)", "wall_s": t_smilen},
    ]
    table = pd.DataFrame(rows)
    table["audio_s_per_s"] = audio_s / table["wall_s"]
    table["ratio_to_opensmile_1proc"] = table["wall_s"] / t_smile1
    print(f"\n{len(files)} files, {audio_s:.0f} s of audio, {os.cpu_count()} cores")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"\nratio voicebias full set / openSMILE, one process each: {rows[0]['wall_s'] / t_smile1:.2f}")
    print("\nper component, one process (s per file; pitch and formant tracks counted where first computed):")
    print(component_costs(files, params).to_string(index=False, float_format=lambda v: f"{v:.3f}"))

    # cross-check on the measures both tools report
    ref = ref.reset_index()
    ref["id"] = ref["file"].map(lambda p: Path(p).stem)
    both = ours.join(ref.set_index("id"), how="inner")
    both = both[both["status"] == "ok"].join(files.set_index("id")[["voice_gender"]])
    f0_smile_st = both["F0semitoneFrom27.5Hz_sma3nz_percentile50.0"] + 12 * np.log2(27.5 / 100.0)
    d_f0 = both["f0_median_st"] - f0_smile_st
    print(
        f"\nF0 median (st re 100 Hz): voicebias - openSMILE = {d_f0.median():+.2f} st (median), "
        f"r = {np.corrcoef(both['f0_median_st'], f0_smile_st)[0, 1]:.3f}"
    )
    r_h = np.corrcoef(both["h1_h2_db"], both["logRelF0-H1-H2_sma3nz_amean"])[0, 1]
    print(f"H1-H2: r = {r_h:.3f} between voicebias (median, dB) and openSMILE (mean, dB); per-voice means:")
    print(
        both.groupby("voice_gender")[
            ["h1_h2_db", "logRelF0-H1-H2_sma3nz_amean", "h1_a3_db", "logRelF0-H1-A3_sma3nz_amean"]
        ]
        .mean()
        .round(2)
        .to_string()
    )
    excluded = ours[ours["status"] != "ok"]
    if len(excluded):
        print(f"\n{len(excluded)} files excluded: {excluded['reason'].value_counts().to_dict()}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
