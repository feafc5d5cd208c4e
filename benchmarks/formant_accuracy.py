"""Benchmark: formant accuracy of candidate analyses on synthetic vowels with known formants.

The grid: five vowels (/i e a o u/) x two vocal tracts (adult male; female = male
formants x 1.17) x six F0s (90-260 Hz), each a 0.5 s source-filter vowel at 16 kHz
(tests/fakes/stimuli.py: Rosenberg glottal pulses through five resonators). Every
analysis reads F1-F3 (Hz, median over voiced frames) and the formant index
(voicebias.instruments.formants.formant_index, median of the per-frame index, octaves).

Analyses compared:

- burg_by_gender: Praat Burg, five formants below a ceiling chosen by the intended
  voice gender (5000 Hz male, 5500 Hz female);
- robust_by_gender: Praat "To Formant (robust)..." with the same ceilings;
- burg_adapted: Praat Burg with the ceiling chosen per file from 4500-6500 Hz (steps
  of 250 Hz) as the one that minimises the variance of the F1 and F2 tracks (log Hz),
  after Escudero et al. (2009);
- dap_by_gender: discrete all-pole modelling of the harmonics (El-Jaroudi & Makhoul,
  1991; voicebias.instruments.formants.dap_formants), ceilings by gender;
- dap_neutral: the same with the gender-neutral settings (MeasureSettings.neutral:
  ceiling 5500 Hz, pitch range 60-500 Hz with the octave check).

All of them track pitch over the gender-neutral range, so only the formant analysis
differs.

Targets: F2 and F3 within 5 % everywhere; F1 within 10 % wherever F0 < 0.8 F1; the
formant index moving by at most 0.1 reference SD across the six F0s with the formants
fixed. The reference SD is the formant_index SD of data/measures/composite_reference.csv
(the smallest over languages) when that file exists, otherwise that of the modal SC
stimuli (reports/phonation/measures.csv, both genders pooled, as the composite
reference pools them).

Prints markdown (the tables of docs/formants.md). Run:

    .venv/bin/python benchmarks/formant_accuracy.py > /tmp/formants.md
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.stimuli import MALE_VOWEL_FORMANTS, synthetic_vowel, vowel_formants  # noqa: E402
from voicebias.instruments.acoustics import MeasureSettings, measure_signal  # noqa: E402
from voicebias.instruments.formants import MALE_FORMANT_NORMS  # noqa: E402
from voicebias.params import load_params  # noqa: E402

SR = 16000
VOWELS = tuple(MALE_VOWEL_FORMANTS)
TRACTS = ("male", "female")
F0S = (90.0, 120.0, 150.0, 180.0, 210.0, 260.0)
ADAPTED_CEILINGS = tuple(np.arange(4500.0, 6501.0, 250.0))
F23_TOLERANCE, F1_TOLERANCE, F1_RESOLVABLE, INDEX_TOLERANCE_SD = 0.05, 0.10, 0.8, 0.1

Analysis = Callable[[np.ndarray, str], tuple[np.ndarray, float]]


def _voiced_frames(x: np.ndarray, floor: float, ceiling: float) -> tuple[parselmouth.Sound, np.ndarray]:
    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=SR)
    pitch = snd.to_pitch(0.01, floor, ceiling)
    f0 = pitch.selected_array["frequency"]
    return snd, pitch.xs()[f0 > 0]


def _tracks(formant: parselmouth.Formant, times: np.ndarray) -> np.ndarray:
    idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
    tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3)], axis=1)
    tracks[tracks <= 0] = np.nan
    return tracks[np.isfinite(tracks).all(axis=1)]


def _summary(frames: np.ndarray) -> tuple[np.ndarray, float]:
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    return np.median(frames, axis=0), index


def _gender_settings(params: dict, tract: str, method: str) -> MeasureSettings:
    return replace(MeasureSettings.for_gender(params, tract), formant_method=method, voice_quality=False)


def analyses(params: dict) -> dict[str, Analysis]:
    """The compared analyses: name -> f(signal, tract) -> (F1-F3 in Hz, formant index)."""
    ceilings = {"male": 5000.0, "female": 5500.0}
    # Only the formant analysis differs between methods: every one tracks pitch over
    # the gender-neutral range (a 100 Hz floor by gender would lose the 90 Hz cells of
    # the female tract before any formant is measured).
    wide = tuple(params.get("neutral_pitch_range", (60.0, 500.0)))
    by_gender = {**params, "max_formant": ceilings, "pitch_range": {"male": wide, "female": wide}}
    neutral = replace(MeasureSettings.neutral(params), voice_quality=False)

    def product(settings_of: Callable[[str], MeasureSettings]) -> Analysis:
        def run(x: np.ndarray, tract: str) -> tuple[np.ndarray, float]:
            m = measure_signal(x, SR, settings_of(tract))
            return np.array([m["f1_hz"], m["f2_hz"], m["f3_hz"]]), m["formant_index"]

        return run

    def robust(x: np.ndarray, tract: str) -> tuple[np.ndarray, float]:
        snd, times = _voiced_frames(x, *wide)
        formant = call(snd, "To Formant (robust)...", 0.01, 5, ceilings[tract], 0.025, 50.0, 1.5, 5, 1e-6)
        return _summary(_tracks(formant, times))

    def adapted(x: np.ndarray, tract: str) -> tuple[np.ndarray, float]:
        snd, times = _voiced_frames(x, *wide)
        best, best_cost = None, np.inf
        for ceiling in ADAPTED_CEILINGS:
            frames = _tracks(snd.to_formant_burg(0.01, 5, float(ceiling), 0.025, 50.0), times)
            if len(frames) < 3:
                continue
            cost = float(np.var(np.log(frames[:, 0])) + np.var(np.log(frames[:, 1])))
            if cost < best_cost:
                best, best_cost = frames, cost
        return _summary(best)

    return {
        "burg_by_gender": product(lambda t: _gender_settings(by_gender, t, "burg")),
        "robust_by_gender": robust,
        "burg_adapted": adapted,
        "dap_by_gender": product(lambda t: _gender_settings(by_gender, t, "dap")),
        "dap_neutral": product(lambda t: neutral),
    }


def reference_sd() -> tuple[float, str]:
    """The formant index's reference SD (octaves) and where it comes from."""
    ref = ROOT / "data" / "measures" / "composite_reference.csv"
    if ref.exists():
        table = pd.read_csv(ref)
        sd = float(table.loc[table["measure"] == "formant_index", "sd"].min())
        return sd, f"{ref.relative_to(ROOT)} (smallest SD over languages)"
    table = pd.read_csv(ROOT / "reports" / "phonation" / "measures.csv")
    sd = float(table.loc[table["phonation"] == "modal", "formant_index"].std(ddof=1))
    return sd, "reports/phonation/measures.csv (modal SC stimuli, both genders pooled)"


def run_grid(methods: dict[str, Analysis]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per method x vowel x tract x F0 (true and measured F1-F3, errors, index),
    and one per method x tract x F0 for a passage of all five vowels in a row."""
    rows, passages = [], []
    for tract in TRACTS:
        for f0 in F0S:
            signals = {v: synthetic_vowel(f0, vowel_formants(v, tract)) for v in VOWELS}
            passage = np.concatenate(list(signals.values()))
            for name, run in methods.items():
                for v, x in signals.items():
                    true = np.array(vowel_formants(v, tract)[:3])
                    measured, index = run(x, tract)
                    rows.append(
                        {
                            "method": name,
                            "vowel": v,
                            "tract": tract,
                            "f0_hz": f0,
                            **{f"f{i + 1}_true": true[i] for i in range(3)},
                            **{f"f{i + 1}_hz": measured[i] for i in range(3)},
                            **{f"f{i + 1}_err_pct": 100 * (measured[i] / true[i] - 1) for i in range(3)},
                            "index": index,
                            "index_true": float(np.mean(np.log2(true / np.array(MALE_FORMANT_NORMS)))),
                        }
                    )
                passages.append({"method": name, "tract": tract, "f0_hz": f0, "index": run(passage, tract)[1]})
    grid = pd.DataFrame(rows)
    grid["f1_target"] = grid["f0_hz"] < F1_RESOLVABLE * grid["f1_true"]
    grid["f1_ok"] = ~grid["f1_target"] | (grid["f1_err_pct"].abs() <= 100 * F1_TOLERANCE)
    grid["f2_ok"] = grid["f2_err_pct"].abs() <= 100 * F23_TOLERANCE
    grid["f3_ok"] = grid["f3_err_pct"].abs() <= 100 * F23_TOLERANCE
    return grid, pd.DataFrame(passages)


def index_movement(grid: pd.DataFrame, passages: pd.DataFrame, sd: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Range (max - min) of the formant index over the six F0s, in reference SDs: per
    method x vowel x tract, and per method x tract for the five-vowel passage."""
    per_vowel = (
        grid.groupby(["method", "vowel", "tract"])["index"]
        .agg(lambda s: (s.max() - s.min()) / sd)
        .rename("index_range_sd")
        .reset_index()
    )
    per_passage = (
        passages.groupby(["method", "tract"])["index"]
        .agg(lambda s: (s.max() - s.min()) / sd)
        .rename("index_range_sd")
        .reset_index()
    )
    return per_vowel, per_passage


def pitch_shift_effect(methods: dict[str, Analysis], sd: float, shift_st: float = 2.0) -> pd.DataFrame:
    """Change of the five-vowel passage's formant index (reference SDs) when F0 rises by
    `shift_st` semitones with the formants fixed: what an F0-only drift adds to the
    composite through the formant index. From 120 Hz (male tract) and 210 Hz (female)."""
    rows = []
    for tract, f0 in (("male", 120.0), ("female", 210.0)):
        pair = [
            np.concatenate([synthetic_vowel(f, vowel_formants(v, tract)) for v in VOWELS])
            for f in (f0, f0 * 2 ** (shift_st / 12))
        ]
        for name, run in methods.items():
            before, after = (run(x, tract)[1] for x in pair)
            rows.append({"method": name, "tract": tract, "from_f0_hz": f0, "index_change_sd": (after - before) / sd})
    return pd.DataFrame(rows)


def noise_check(methods: dict[str, Analysis], snrs_db: tuple[float, ...] = (40.0, 25.0), seed: int = 1) -> pd.DataFrame:
    """The grid with white noise added at each SNR (dB re the vowel's RMS): per method and
    SNR, the cells within all three targets and the RMS % error of F1-F3."""
    rng = np.random.default_rng(seed)
    rows = []
    for snr in snrs_db:
        noisy = {}
        for tract in TRACTS:
            for f0 in F0S:
                for v in VOWELS:
                    x = synthetic_vowel(f0, vowel_formants(v, tract)).astype(np.float64)
                    noisy[(v, tract, f0)] = x + rng.normal(0.0, np.std(x) * 10 ** (-snr / 20), len(x))
        for name, run in methods.items():
            errs, ok = [], 0
            for (v, tract, f0), x in noisy.items():
                true = np.array(vowel_formants(v, tract)[:3])
                e = 100 * (run(x, tract)[0] / true - 1)
                errs.append(e)
                f1_ok = f0 >= F1_RESOLVABLE * true[0] or abs(e[0]) <= 100 * F1_TOLERANCE
                ok += bool(f1_ok and abs(e[1]) <= 100 * F23_TOLERANCE and abs(e[2]) <= 100 * F23_TOLERANCE)
            rms = np.sqrt(np.mean(np.square(errs), axis=0))
            rows.append(
                {
                    "method": name,
                    "snr_db": snr,
                    "all three ok": f"{ok}/{len(noisy)}",
                    **{f"F{i + 1} rms err %": round(float(rms[i]), 1) for i in range(3)},
                }
            )
    return pd.DataFrame(rows)


def summary(
    grid: pd.DataFrame, per_vowel: pd.DataFrame, per_passage: pd.DataFrame, seconds: dict[str, float]
) -> pd.DataFrame:
    """Per method: share of cells within each target, worst errors, index ranges, time."""
    out = []
    for name, g in grid.groupby("method", sort=False):
        target = g[g["f1_target"]]
        pv, pp = per_vowel[per_vowel["method"] == name], per_passage[per_passage["method"] == name]
        within = int((pv["index_range_sd"] <= INDEX_TOLERANCE_SD).sum())
        out.append(
            {
                "method": name,
                "F1 ok (F0 < 0.8 F1)": f"{int(target['f1_ok'].sum())}/{len(target)}",
                "F2 ok": f"{int(g['f2_ok'].sum())}/{len(g)}",
                "F3 ok": f"{int(g['f3_ok'].sum())}/{len(g)}",
                "all three ok": f"{int((g['f1_ok'] & g['f2_ok'] & g['f3_ok']).sum())}/{len(g)}",
                "max abs F1 err % (target cells)": round(float(target["f1_err_pct"].abs().max()), 1),
                "max abs F2 err %": round(float(g["f2_err_pct"].abs().max()), 1),
                "max abs F3 err %": round(float(g["f3_err_pct"].abs().max()), 1),
                "index range <= 0.1 SD (vowel x tract)": f"{within}/{len(pv)}",
                "max index range (SD), single vowels": round(float(pv["index_range_sd"].max()), 2),
                "max index range (SD), five-vowel passage": round(float(pp["index_range_sd"].max()), 2),
                "s per grid": round(seconds[name], 2),
            }
        )
    return pd.DataFrame(out)


def error_grid(grid: pd.DataFrame, method: str) -> pd.DataFrame:
    """% errors 'F1/F2/F3' per vowel x tract (rows) and F0 (columns); '*' marks a cell
    missing a target."""
    g = grid[grid["method"] == method]
    table = {}
    for (tract, vowel), cells in g.groupby(["tract", "vowel"], sort=False):
        row = {}
        for c in cells.itertuples():
            flag = "" if (c.f1_ok and c.f2_ok and c.f3_ok) else "*"
            row[f"{c.f0_hz:g} Hz"] = f"{c.f1_err_pct:+.0f}/{c.f2_err_pct:+.0f}/{c.f3_err_pct:+.0f}{flag}"
        table[f"{vowel} {tract}"] = row
    return pd.DataFrame(table).T.rename_axis("vowel tract").reset_index()


def cell_table(grid: pd.DataFrame, method: str) -> pd.DataFrame:
    """True vs measured F1-F3 (Hz) and % error per cell of one method."""
    g = grid[grid["method"] == method]
    return pd.DataFrame(
        {
            "vowel": g["vowel"],
            "tract": g["tract"],
            "F0": g["f0_hz"].map("{:g}".format),
            **{f"F{i} true": g[f"f{i}_true"].round(0).astype(int) for i in (1, 2, 3)},
            **{f"F{i}": g[f"f{i}_hz"].round(0) for i in (1, 2, 3)},
            **{f"F{i} err %": g[f"f{i}_err_pct"].round(1) for i in (1, 2, 3)},
            "F1 target": np.where(g["f1_target"], "yes", "no"),
            "index": g["index"].round(3),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", action="store_true", help="also print the per-cell table of every method")
    args = ap.parse_args()
    params = load_params(ROOT / "params.yaml")["acoustics"]
    methods = analyses(params)
    sd, source = reference_sd()
    seconds: dict[str, float] = {}
    grids, passage_rows = [], []
    for name, run in methods.items():
        t = time.perf_counter()
        g, p = run_grid({name: run})
        seconds[name] = time.perf_counter() - t
        grids.append(g)
        passage_rows.append(p)
    grid, passages = pd.concat(grids, ignore_index=True), pd.concat(passage_rows, ignore_index=True)
    per_vowel, per_passage = index_movement(grid, passages, sd)
    print(f"Reference SD of the formant index: {sd:.4f} octaves, from {source}; 0.1 SD = {0.1 * sd:.4f} octaves.\n")
    print("## Summary per method\n")
    print(summary(grid, per_vowel, per_passage, seconds).to_markdown(index=False))
    for name in methods:
        print(f"\n## {name}: % error F1/F2/F3 (* = a target missed)\n")
        print(error_grid(grid, name).to_markdown(index=False))
    print("\n## Formant index range over F0 (reference SDs)\n")
    wide = per_vowel.pivot_table(index=["vowel", "tract"], columns="method", values="index_range_sd", sort=False)
    passage = per_passage.pivot_table(index="tract", columns="method", values="index_range_sd", sort=False)
    passage.index = [f"five-vowel passage, {t}" for t in passage.index]
    wide.index = [f"{v} {t}" for v, t in wide.index]
    print(pd.concat([wide, passage])[list(methods)].round(2).to_markdown())
    print("\n## Formant index change for a +2 st F0 shift, formants fixed (five-vowel passage, reference SDs)\n")
    shift = pitch_shift_effect(methods, sd)
    shift["start"] = shift["tract"] + " tract, from " + shift["from_f0_hz"].map("{:g} Hz".format)
    print(
        shift.pivot_table(index="start", columns="method", values="index_change_sd", sort=False)[list(methods)]
        .round(3)
        .to_markdown()
    )
    print("\n## With white noise: cells within all three targets, RMS % error\n")
    compared = {k: methods[k] for k in ("burg_by_gender", "robust_by_gender", "dap_neutral")}
    print(noise_check(compared).to_markdown(index=False))
    for name in methods if args.cells else ("burg_by_gender", "dap_neutral"):
        print(f"\n## {name}: true vs measured per cell\n")
        print(cell_table(grid, name).to_markdown(index=False))


if __name__ == "__main__":
    main()
