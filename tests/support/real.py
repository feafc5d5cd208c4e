"""The real recordings in tests/fixtures/real, measured as a user would measure them.

`hillenbrand_table(mode)`: the 360 /hVd/ tokens of Hillenbrand et al. (1995) measured with the
settings of each talker's group (men: male; women and children: female) over one stretch per token:

- ``published_steady``: the 100 ms around the judges' steady state (the mean of the two judges' times),
  as a TextGrid interval (a span region) with the whole token as context;
- ``whole``: the whole token, /h/ and /d/ included (`voicebias measure` with no option);
- the automatic regions of voicebias.instruments.regions (``voiced``, ``nucleus``, ``steady``).

`accuracy(table)`: the share of tokens per group within 5 % (F0), 15 % (F1, where F0 < 0.8 F1) and
10 % (F2) of the published values. `librispeech_table()`: the 60 LibriSpeech readers measured with the
gender-neutral settings (`voicebias measure --gender auto`). Run this module to print the docs table.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from voicebias import config
from voicebias.instruments.acoustics import MeasureSettings, measure_files
from voicebias.instruments.regions import span
from voicebias.params import load_params

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
HILLENBRAND = REAL / "hillenbrand1995"
LIBRISPEECH = REAL / "librispeech-train-clean-100"
MODES = ("published_steady", "whole", "voiced", "nucleus", "steady")
GROUPS = ("men", "women", "kids")
#: the published values compared, with their tolerance
TOLERANCE = {"f0": 0.05, "f1": 0.15, "f2": 0.10}
#: steady-state stretch around the judges' time (s)
STEADY_S = 0.1


def _acoustics() -> dict:
    return load_params(config.PROFILES_DIR / "embedded.yaml")["acoustics"]


def reference() -> pd.DataFrame:
    return pd.read_csv(HILLENBRAND / "reference.csv")


@lru_cache(maxsize=None)
def hillenbrand_table(mode: str) -> pd.DataFrame:
    """One row per token: the published values (published_*) and the measured ones, status and reason."""
    ref = reference()
    a = _acoustics()
    base = {g: replace(MeasureSettings.for_gender(a, g), voice_quality=False) for g in ("male", "female")}
    jobs = []
    for r in ref.itertuples():
        s = base["male" if r.group == "men" else "female"]
        if mode == "published_steady":
            centre = (r.steady_judge1_ms + r.steady_judge2_ms) / 2000
            s = replace(s, region=span(centre - STEADY_S / 2, centre + STEADY_S / 2))
        elif mode != "whole":
            s = replace(s, region=mode)
        jobs.append((r.token, HILLENBRAND / r.file, s))
    measured = measure_files(jobs, workers=2, desc=f"hillenbrand {mode}").rename(columns={"id": "token"})
    published = ref.rename(columns={f"{k}_hz": f"published_{k}" for k in ("f0", "f1", "f2", "f3")})
    return published.merge(measured, on="token", validate="one_to_one")


def within(table: pd.DataFrame) -> pd.DataFrame:
    """Per token: whether F0, F1 and F2 are within tolerance (NaN where not compared: F1 only where
    F0 < 0.8 F1, formants not where disputed; an excluded token counts as a miss)."""
    ok = table["status"] == "ok"
    out = pd.DataFrame(index=table.index)
    out["f0"] = ok & ((table["f0_median_hz"] / table["published_f0"] - 1).abs() <= TOLERANCE["f0"])
    for k in ("f1", "f2"):
        hit = ok & ((table[f"{k}_hz"] / table[f"published_{k}"] - 1).abs() <= TOLERANCE[k])
        out[k] = hit.astype(float).where(table["formants_disputed"] == 0)
    out.loc[~(table["published_f0"] < 0.8 * table["published_f1"]), "f1"] = np.nan
    return out


def accuracy(table: pd.DataFrame) -> pd.DataFrame:
    """Share within tolerance per group (rows men, women, kids; columns f0, f1, f2, n)."""
    w = within(table).astype(float)
    w["group"] = table["group"]
    out = w.groupby("group")[["f0", "f1", "f2"]].mean()
    out["n"] = table.groupby("group").size()
    return out.loc[list(GROUPS)]


def far_off(table: pd.DataFrame, limit: float = 0.2) -> pd.DataFrame:
    """Tokens whose measured F0 is more than `limit` (relative) from the published one."""
    ratio = table["f0_median_hz"] / table["published_f0"]
    return table.loc[(ratio - 1).abs() > limit, ["token", "published_f0", "f0_median_hz"]]


@lru_cache(maxsize=None)
def librispeech_table() -> pd.DataFrame:
    """One row per reader (file, speaker, sex) with the measures under the gender-neutral settings."""
    ref = pd.read_csv(LIBRISPEECH / "reference.csv")
    s = replace(MeasureSettings.neutral(_acoustics()), voice_quality=False)
    jobs = [(r.file, LIBRISPEECH / r.file, s) for r in ref.itertuples()]
    measured = measure_files(jobs, workers=2, desc="librispeech").rename(columns={"id": "file"})
    return ref.merge(measured, on="file", validate="one_to_one")


@lru_cache(maxsize=None)
def hillenbrand_adults_neutral() -> pd.DataFrame:
    """The men's and women's whole tokens under the gender-neutral settings, with `sex` (F/M)."""
    ref = reference()
    ref = ref[ref["group"] != "kids"]
    s = replace(MeasureSettings.neutral(_acoustics()), voice_quality=False)
    jobs = [(r.token, HILLENBRAND / r.file, s) for r in ref.itertuples()]
    measured = measure_files(jobs, workers=2, desc="hillenbrand adults").rename(columns={"id": "token"})
    out = ref[["token", "talker", "group", "vowel"]].merge(measured, on="token", validate="one_to_one")
    return out.assign(sex=np.where(out["group"] == "women", "F", "M"))


#: probability bins of the reliability table
BINS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


def classified(table: pd.DataFrame) -> pd.DataFrame:
    """The measured rows with the acoustic-norms margin, P(female) and whether the call is right."""
    from voicebias.instruments.classifiers import AcousticNormsClassifier

    clf = AcousticNormsClassifier()
    ok = table[table["status"] == "ok"].copy()
    ok["margin"] = clf.margins(ok)
    ok["p_female"] = clf.probability(ok)
    ok["right"] = (ok["margin"] > 0) == (ok["sex"] == "F")
    return ok


def classifier_accuracy() -> pd.DataFrame:
    """Share right per set and sex (sets: librispeech readers, hillenbrand adult tokens)."""
    rows = []
    for name, table in (("librispeech", librispeech_table()), ("hillenbrand adults", hillenbrand_adults_neutral())):
        c = classified(table)
        for sex, g in c.groupby("sex"):
            rows.append(
                {"set": name, "sex": sex, "n": len(g), "right": int(g["right"].sum()), "accuracy": g["right"].mean()}
            )
    return pd.DataFrame(rows)


def reliability() -> pd.DataFrame:
    """Reliability table over both sets: per bin of P(female), the number of files, their mean
    predicted P(female) and the observed share of women."""
    c = pd.concat([classified(librispeech_table()), classified(hillenbrand_adults_neutral())], ignore_index=True)
    c["bin"] = pd.cut(c["p_female"], BINS, include_lowest=True)
    out = c.groupby("bin", observed=False).agg(
        n=("p_female", "size"), predicted=("p_female", "mean"), observed=("sex", lambda v: (v == "F").mean())
    )
    return out


def spiegelhalter_z() -> float:
    """Spiegelhalter's (1986, Stat. Med. 5: 421-433) z of P(female) over both sets: sum (y - p)(1 - 2p)
    over sqrt(sum (1 - 2p)^2 p (1 - p)); standard normal when the probabilities are calibrated."""
    c = pd.concat([classified(librispeech_table()), classified(hillenbrand_adults_neutral())], ignore_index=True)
    p, y = c["p_female"].to_numpy(float), (c["sex"] == "F").to_numpy(float)
    return float(np.sum((y - p) * (1 - 2 * p)) / np.sqrt(np.sum((1 - 2 * p) ** 2 * p * (1 - p))))


def classifier_markdown() -> str:
    """The accuracy and reliability tables of docs/accuracy.md."""
    acc = classifier_accuracy()
    lines = ["| set | sex | n | right | accuracy |", "|---|---|---:|---:|---:|"]
    for r in acc.itertuples():
        lines.append(f"| {r.set} | {r.sex} | {r.n} | {r.right} | {100 * r.accuracy:.1f} % |")
    lines += ["", "| P(female) | files | mean predicted | observed share female |", "|---|---:|---:|---:|"]
    for b, r in reliability().iterrows():
        lines.append(
            f"| {max(b.left, 0.0):.1f}-{b.right:.1f} | {int(r['n'])} | "
            + (f"{r['predicted']:.3f} | {r['observed']:.3f} |" if r["n"] else "- | - |")
        )
    lines += ["", "| set | misjudged (sex, F0 Hz, vocal-tract index, P(female)) |", "|---|---|"]
    for name, table, key in (
        ("librispeech", librispeech_table(), "speaker"),
        ("hillenbrand adults", hillenbrand_adults_neutral(), "token"),
    ):
        c = classified(table)
        wrong = c[~c["right"]].sort_values(key)
        lines.append(
            f"| {name} | "
            + "; ".join(
                f"{getattr(r, key)} ({r.sex}, {r.f0_median_hz:.0f}, {r.vtl_index:+.3f}, {r.p_female:.2f})"
                for r in wrong.itertuples()
            )
            + " |"
        )
    return "\n".join(lines)


def accuracy_markdown() -> str:
    """The per-group table of docs/accuracy.md: one row per measuring mode and group."""
    lines = [
        "| stretch measured | group | n | F0 within 5 % | F1 within 15 % | F2 within 10 % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        acc = accuracy(hillenbrand_table(mode))
        for g, r in acc.iterrows():
            lines.append(
                f"| {mode} | {g} | {int(r['n'])} | "
                + " | ".join(f"{100 * r[k]:.1f} %" for k in ("f0", "f1", "f2"))
                + " |"
            )
    return "\n".join(lines)


def published_f4() -> pd.DataFrame:
    """token and published_f4 (Hz; NaN where not measurable) of every token of Hillenbrand et al.'s
    published measurement table (orig_vowdata.dat; reference.csv has F0-F3 only)."""
    rows = []
    for line in (HILLENBRAND / "orig_vowdata.dat").read_text(encoding="latin-1").splitlines():
        parts = line.split()
        if len(parts) == 16 and parts[0][:1] in "mwbg" and parts[0][1:3].isdigit():
            rows.append({"token": parts[0], "published_f4": float(parts[6])})
    return pd.DataFrame(rows).replace(0.0, np.nan)


def upper_formant_table() -> pd.DataFrame:
    """The whole tokens (`hillenbrand_table('whole')`) with the published F4, the vocal-tract index
    of the published F3 and F4 (published_vtl) and the measured index's error (vtl_error, octaves)."""
    from voicebias.instruments.formants import vtl_index

    t = hillenbrand_table("whole").merge(published_f4(), on="token", how="left", validate="one_to_one")
    t["published_vtl"] = vtl_index(t["published_f3"], t["published_f4"])
    t["vtl_error"] = t["vtl_index"] - t["published_vtl"]
    return t


def separation(table: pd.DataFrame, col: str) -> float:
    """The probability that a woman's token reads higher on `col` than a man's (AUC, ties half)."""
    from scipy.stats import mannwhitneyu

    a = table.loc[table["group"] == "women", col].dropna()
    b = table.loc[table["group"] == "men", col].dropna()
    return float(mannwhitneyu(a, b).statistic / (len(a) * len(b)))


def upper_formant_markdown() -> str:
    """The F4 / vocal-tract index table of docs/accuracy.md (whole tokens, gender settings)."""
    t = upper_formant_table()
    lines = [
        "| group | tokens with a published F4 | F4 within 10 % | median F4 error "
        "| median abs. vocal-tract index error (oct) |",
        "|---|---:|---:|---:|---:|",
    ]
    for g in GROUPS:
        d = t[(t["group"] == g) & t["published_f4"].notna()]
        err = d["f4_hz"] / d["published_f4"] - 1
        lines.append(
            f"| {g} | {len(d)} | {100 * (err.abs() <= 0.10).mean():.1f} % | {100 * err.median():+.1f} % | "
            f"{d['vtl_error'].abs().median():.3f} |"
        )
    lines += [
        "",
        "| index | women above men (AUC, 240 adult tokens) |",
        "|---|---:|",
        *(f"| {c} | {separation(t, c):.3f} |" for c in ("vtl_index", "formant_index", "f3_hz")),
    ]
    return "\n".join(lines)


def vowel_table() -> pd.DataFrame:
    """The adult tokens of Hillenbrand et al.'s published measurement table (orig_vowdata.dat) whose
    talkers are not test talkers here: token, sex (F/M), talker, f0, F3 and F4 (Hz; NaN where not measurable)."""
    rows = []
    for line in (HILLENBRAND / "orig_vowdata.dat").read_text(encoding="latin-1").splitlines():
        parts = line.split()
        if len(parts) == 16 and parts[0][:1] in "mw" and parts[0][1:3].isdigit():
            rows.append({"token": parts[0], "f0": float(parts[2]), "f3": float(parts[5]), "f4": float(parts[6])})
    table = pd.DataFrame(rows).replace(0.0, np.nan)
    table["talker"] = table["token"].str[:3]
    table["sex"] = np.where(table["token"].str[0] == "w", "F", "M")
    return table[~table["talker"].isin(set(reference()["talker"]))].reset_index(drop=True)


def vowel_table_norms() -> dict[str, dict[str, float]]:
    """Per sex, over the talkers of `vowel_table` (each talker's mean over its vowels): the SD of F0
    (semitones), the mean and SD of the vocal-tract index of the published F3 and F4 (octaves; tokens
    with both), and the number of talkers."""
    from voicebias.instruments.formants import vtl_index

    t = vowel_table()
    t["f0_st"] = 12 * np.log2(t["f0"] / 100)
    t["vtl"] = np.where(t["f4"].notna(), vtl_index(t["f3"], t["f4"]), np.nan)
    per = t.groupby(["sex", "talker"])[["f0_st", "vtl"]].mean()
    out = {}
    for sex, g in per.groupby(level="sex"):
        out["female" if sex == "F" else "male"] = {
            "f0_sd_st": float(g["f0_st"].std(ddof=1)),
            "vtl_index": float(g["vtl"].mean()),
            "vtl_sd_oct": float(g["vtl"].std(ddof=1)),
            "talkers": len(g),
        }
    return out


def calibration_slope(norms_margin) -> float:
    """The slope a of P(female) = 1 / (1 + exp(-a * LLR)), by maximum likelihood (logistic regression
    through the origin) on the tokens of `vowel_table` with F0, F3 and F4; `norms_margin(f0_st, vtl)`
    gives the LLR."""
    import statsmodels.api as sm

    from voicebias.instruments.formants import vtl_index

    t = vowel_table().dropna(subset=["f0", "f3", "f4"])
    llr = norms_margin(12 * np.log2(t["f0"].to_numpy() / 100), vtl_index(t["f3"].to_numpy(), t["f4"].to_numpy()))
    fit = sm.Logit((t["sex"] == "F").to_numpy(float), llr.reshape(-1, 1)).fit(disp=0)
    return float(fit.params[0])


if __name__ == "__main__":  # pragma: no cover - prints the docs tables
    print(accuracy_markdown(), upper_formant_markdown(), classifier_markdown(), sep="\n\n")
