"""Manipulation check of the phonation conversion.

Every stimulus of data/phonation/manifest.csv is measured (F0, H1-H2, H1-A3, CPPS) over the whole
file and over each half, and each converted stimulus is compared with its modal original; the
expected direction of each change comes from the preset itself. The summary goes to
reports/phonation/manipulation_check.csv, and the stage fails when a condition moves a measure the
wrong way on average for any voice, or a voice's converted files are no closer to its modal
original than the other voice of its gender is. The carrier check is repeated per condition
(reports/phonation/classifier_flips.csv). A stimulus a classifier hears as the other gender, or one
that cannot be measured, is a counted exclusion with its reason (reports/phonation/excluded_stimuli.csv;
no system hears it) as long as the excluded share stays within `phonation.max_excluded_fraction`;
above it the stage fails.

The contrasts and the rules: docs/phonation.md, "The manipulation check".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from voicebias.contract import (
    CPPS,
    F0_HZ,
    F0_ST,
    F1,
    F2,
    F3,
    F4,
    FORMANT_INDEX,
    H1_A3,
    H1_H2,
    SC_COMPONENTS,
    SC_MEASURES,
    VTL_INDEX,
)
from voicebias.instruments.acoustics import MeasureSettings, measure_files
from voicebias.validation import ValidationReport, expectations, require_valid

#: measures of the check -> the preset feature whose sign sets their expected direction
MEASURES = {H1_H2: "h1_h2", H1_A3: "h1_a3", CPPS: "cpps", F0_ST: None}
PARTS = ("whole", "first_half", "second_half")
CHECK_COLUMNS = [
    "lang",
    "voice_gender",
    "voice_id",
    "phonation",
    "measure",
    "contrast",
    "expected_sign",
    "n",
    "mean_change",
    "sd_change",
    "signed_change",
    "ok",
]


def measure_stimuli(
    manifest: pd.DataFrame,
    acoustics: dict[str, Any],
    root: Path,
    workers: int | None = None,
    cache_dir: Path | None = None,
) -> pd.DataFrame:
    """Whole-file and half-file measures of every stimulus (one row each, on all cores,
    through the measurement cache under `cache_dir` when given). A stimulus is excluded
    (measure_status 'excluded', measure_error '<code>: <message>') at the first of its
    parts that cannot be measured; the parts before it keep their values."""
    settings = {
        r.stimulus_id: MeasureSettings.for_gender(acoustics, r.voice_gender) for r in manifest.itertuples(index=False)
    }
    jobs = [
        (f"{r.stimulus_id}\t{part}", str(Path(root) / r.path), settings[r.stimulus_id], part)
        for r in manifest.itertuples(index=False)
        for part in PARTS
    ]
    measured = measure_files(
        jobs, workers=workers, desc="manipulation check", cache_dir=cache_dir, components=SC_COMPONENTS
    )
    by_id = {k: r for k, r in zip(measured["id"], measured.to_dict("records"))}
    rows = []
    for sid in manifest["stimulus_id"]:
        row: dict[str, Any] = {"stimulus_id": sid, "measure_status": "ok", "measure_error": ""}
        for part in PARTS:
            m = by_id[f"{sid}\t{part}"]
            if m["status"] != "ok":
                row.update(measure_status="excluded", measure_error=f"{m['reason']}: {m['error']}")
                break
            if part == "whole":  # what the gender classifiers read (F0, formants)
                row.update({k: m[k] for k in (F0_HZ, F0_ST, F1, F2, F3, FORMANT_INDEX, F4, VTL_INDEX)})
            for col in (*SC_MEASURES, F0_ST):
                row[f"{col}_{part}"] = m[col]
        rows.append(row)
    return manifest.merge(pd.DataFrame(rows), on="stimulus_id", how="left")


def speaker_similarities(
    manifest: pd.DataFrame, embedder: Any, root: Path, cache_dir: Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per converted stimulus: similarity to its modal original; per prompt x gender:
    similarity between the two modal voices of that gender). Embeddings go through the
    embedding cache under `cache_dir` when given."""
    from voicebias.instruments.embeddings import cosine_similarity, embed_files

    rows = list(manifest.itertuples(index=False))
    # in batches where the embedder batches (ECAPA on a GPU); a bad file excludes only itself
    by_path, path_errors = embed_files(
        [str(r.path) for r in rows], embedder, Path(root), desc="speaker embeddings", cache_dir=cache_dir
    )
    emb: dict[str, np.ndarray | None] = {r.stimulus_id: by_path.get(str(r.path)) for r in rows}
    errors: dict[str, str] = {r.stimulus_id: path_errors[str(r.path)] for r in rows if str(r.path) in path_errors}
    modal = manifest[manifest["phonation"] == "modal"].set_index("source_stimulus_id")["stimulus_id"]
    own = []
    for r in manifest[manifest["phonation"] != "modal"].itertuples(index=False):
        a, b = emb.get(r.stimulus_id), emb.get(modal.get(r.source_stimulus_id, ""))
        own.append(
            {
                "stimulus_id": r.stimulus_id,
                "speaker_similarity": cosine_similarity(a, b) if a is not None and b is not None else np.nan,
                "similarity_error": errors.get(r.stimulus_id, ""),
            }
        )
    between = []
    m = manifest[manifest["phonation"] == "modal"]
    for (prompt, gender), g in m.groupby(["prompt_id", "voice_gender"]):
        g = g.sort_values("voice_id")
        ids = list(g["stimulus_id"])
        for i in range(len(ids)):
            for j in range(i + 1, len(ids)):
                a, b = emb.get(ids[i]), emb.get(ids[j])
                if a is None or b is None:
                    continue
                sim = cosine_similarity(a, b)
                for k in (i, j):
                    between.append(
                        {
                            "prompt_id": prompt,
                            "voice_gender": gender,
                            "voice_id": g["voice_id"].iloc[k],
                            "other_voice_id": g["voice_id"].iloc[j if k == i else i],
                            "between_similarity": sim,
                        }
                    )
    return pd.DataFrame(own, columns=["stimulus_id", "speaker_similarity", "similarity_error"]), pd.DataFrame(
        between, columns=["prompt_id", "voice_gender", "voice_id", "other_voice_id", "between_similarity"]
    )


def expected_signs(preset: dict[str, Any]) -> dict[str, int]:
    """Expected direction (+1/-1) of each measure's change under a preset; absent = no expectation."""
    t = preset.get("targets") or {}
    out: dict[str, int] = {}
    for col, feat in MEASURES.items():
        if feat is not None and t.get(feat, 0) != 0:
            out[col] = int(np.sign(t[feat]))
    if t.get("creak", 0) > 0:
        out[F0_ST] = -1
        out.setdefault(CPPS, -1)
    return out


def paired_changes(measured: pd.DataFrame, presets: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Long table: one row per converted stimulus x measure x contrast with the change and its expected sign."""
    ok = measured[measured["measure_status"] == "ok"]
    modal = ok[ok["phonation"] == "modal"].set_index("source_stimulus_id")
    rows = []
    for r in ok[ok["phonation"] != "modal"].itertuples(index=False):
        if r.source_stimulus_id not in modal.index:
            continue
        m0 = modal.loc[r.source_stimulus_id]
        preset = presets[r.phonation]
        signs = expected_signs(preset)
        ramp = preset.get("shape") == "ramp"
        for col in MEASURES:
            sign = signs.get(col, 0)
            contrasts = {"converted_vs_modal": getattr(r, f"{col}_whole") - m0[f"{col}_whole"]}
            if ramp:
                contrasts = {
                    "converted_vs_modal": contrasts["converted_vs_modal"],
                    "second_vs_first_half": getattr(r, f"{col}_second_half") - getattr(r, f"{col}_first_half"),
                    "second_half_vs_modal_second_half": getattr(r, f"{col}_second_half") - m0[f"{col}_second_half"],
                }
            for name, value in contrasts.items():
                # A ramp preset is judged on its second half; its whole-file change is reported only.
                # Within one file, second vs first half differ by their words too, so that contrast
                # is checked only for the creak signature (lower CPPS and F0); spectral tilt is
                # checked against the modal file's second half, which reads the same words.
                checked = (
                    0
                    if ramp
                    and (name == "converted_vs_modal" or (name == "second_vs_first_half" and col not in (CPPS, F0_ST)))
                    else sign
                )
                rows.append(
                    {
                        "stimulus_id": r.stimulus_id,
                        "lang": r.lang,
                        "voice_gender": r.voice_gender,
                        "voice_id": r.voice_id,
                        "phonation": r.phonation,
                        "measure": col,
                        "contrast": name,
                        "expected_sign": checked,
                        "change": float(value),
                    }
                )
    return pd.DataFrame(rows)


def summarise(
    changes: pd.DataFrame, own_sim: pd.DataFrame, between: pd.DataFrame, manifest: pd.DataFrame
) -> pd.DataFrame:
    """Per language x voice x condition x measure x contrast: n, mean and SD of the change,
    expected sign, signed change (mean x sign) and ok (signed change > 0, or no expectation)."""
    keys = ["lang", "voice_gender", "voice_id", "phonation", "measure", "contrast"]
    g = changes.groupby(keys, sort=True)
    out = g["change"].agg(n="size", mean_change="mean", sd_change="std").reset_index()
    out["expected_sign"] = g["expected_sign"].first().to_numpy()
    sim = own_sim.merge(
        manifest[["stimulus_id", "lang", "voice_gender", "voice_id", "phonation", "prompt_id"]], on="stimulus_id"
    ).dropna(subset=["speaker_similarity"])
    btw = between.groupby(["prompt_id", "voice_id"])["between_similarity"].mean().rename("between_similarity")
    sim = sim.join(btw, on=["prompt_id", "voice_id"])
    rows = []
    for k, s in sim.groupby(["lang", "voice_gender", "voice_id", "phonation"], sort=True):
        rows.append(
            {
                **dict(zip(keys[:4], k)),
                "measure": "speaker_similarity",
                "contrast": "to_modal_original",
                "expected_sign": 0,
                "n": len(s),
                "mean_change": s["speaker_similarity"].mean(),
                "sd_change": s["speaker_similarity"].std(),
            }
        )
        d = (s["speaker_similarity"] - s["between_similarity"]).dropna()
        if len(d):
            rows.append(
                {
                    **dict(zip(keys[:4], k)),
                    "measure": "speaker_similarity",
                    "contrast": "margin_over_other_voice_same_gender",
                    "expected_sign": 1,
                    "n": len(d),
                    "mean_change": d.mean(),
                    "sd_change": d.std(),
                }
            )
    out = pd.concat([out, pd.DataFrame(rows)], ignore_index=True)
    out["expected_sign"] = out["expected_sign"].astype(int)
    out["signed_change"] = np.where(out["expected_sign"] != 0, out["mean_change"] * out["expected_sign"], np.nan)
    out["ok"] = (out["expected_sign"] == 0) | (out["signed_change"] > 0)
    return out[CHECK_COLUMNS]


def classifier_flips(
    measured: pd.DataFrame, acoustics: dict[str, Any], root: Path
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Carrier check per phonation condition: does each gender classifier still hear the
    intended gender? Returns (per stimulus x classifier margins, per voice gender x
    condition x classifier: n, flips, mean margin). Margin > 0 means female."""
    from voicebias.instruments.acoustics import add_margins, classifier_names

    df = measured.assign(status=measured["measure_status"]).copy()
    df = add_margins(df, acoustics, Path(root), path_col="path")
    names = classifier_names(acoustics)
    long = df.melt(
        id_vars=["stimulus_id", "voice_gender", "voice_id", "phonation", "status"],
        value_vars=[f"margin_{n}" for n in names],
        var_name="classifier",
        value_name="margin",
    )
    long["classifier"] = long["classifier"].str.removeprefix("margin_")
    long = long[long["status"] == "ok"].drop(columns="status")
    sign = np.where(long["voice_gender"] == "female", 1.0, -1.0)
    long["flipped"] = (long["margin"] * sign) <= 0
    table = (
        long.groupby(["voice_gender", "phonation", "classifier"], sort=True)
        .agg(n=("flipped", "size"), flips=("flipped", "sum"), mean_margin=("margin", "mean"))
        .reset_index()
    )
    table["flips"] = table["flips"].astype(int)
    return long, table


EXCLUSION_COLUMNS = ["stimulus_id", "lang", "voice_gender", "voice_id", "phonation", "reason", "detail"]


def stimulus_exclusions(measured: pd.DataFrame, margins: pd.DataFrame) -> pd.DataFrame:
    """One row per excluded stimulus, with its first reason: the measurement's reason code when a part
    of it cannot be measured, else 'classifier_flip' when a gender classifier hears the other gender
    (detail: classifier and margin, > 0 female). Ordered as the manifest."""
    rows = []
    flipped = margins[margins["flipped"]]
    first_flip = {sid: g.iloc[0] for sid, g in flipped.groupby("stimulus_id", sort=False)}
    for r in measured.itertuples(index=False):
        if r.measure_status != "ok":
            code, _, msg = str(r.measure_error).partition(": ")
            reason, detail = code, msg
        elif r.stimulus_id in first_flip:
            f = first_flip[r.stimulus_id]
            reason, detail = "classifier_flip", f"{f['classifier']} margin {f['margin']:+.2f}"
        else:
            continue
        rows.append(
            {
                "stimulus_id": r.stimulus_id,
                "lang": r.lang,
                "voice_gender": r.voice_gender,
                "voice_id": r.voice_id,
                "phonation": r.phonation,
                "reason": reason,
                "detail": detail,
            }
        )
    return pd.DataFrame(rows, columns=EXCLUSION_COLUMNS)


def validate_exclusions(excluded: pd.DataFrame, n_stimuli: int, max_fraction: float) -> None:
    """Stop (ValidationFailed) when more than `max_fraction` of the stimuli are excluded, naming them."""
    from voicebias.validation import ValidationFailed

    if n_stimuli and len(excluded) > max_fraction * n_stimuli:
        by_reason = excluded["reason"].value_counts().sort_index()
        raise ValidationFailed(
            f"phonation check: {len(excluded)} of {n_stimuli} stimuli excluded "
            f"({len(excluded) / n_stimuli:.1%} > phonation.max_excluded_fraction {max_fraction:.1%}; "
            + ", ".join(f"{k} {v}" for k, v in by_reason.items())
            + "): "
            + ", ".join(f"{r.stimulus_id} ({r.reason} {r.detail})" for r in excluded.head(20).itertuples())
            + (" ..." if len(excluded) > 20 else "")
        )


def validate_check(summary: pd.DataFrame) -> ValidationReport:
    """'phonation_manipulation' suite: every checked mean change lies in its expected direction."""
    E = expectations()
    checked = summary[summary["expected_sign"] != 0].copy()
    checked["cell"] = (
        checked["lang"]
        + "/"
        + checked["voice_id"]
        + "/"
        + checked["phonation"]
        + "/"
        + checked["measure"]
        + "/"
        + checked["contrast"]
    )
    exps = [
        E.ExpectColumnValuesToBeBetween(column="signed_change", min_value=0, strict_min=True),
        E.ExpectColumnValuesToNotBeNull(column="signed_change"),
    ]
    from voicebias.validation import ValidationFailed

    try:
        return require_valid(checked, "phonation_manipulation", exps)
    except ValidationFailed as exc:
        wrong = checked.loc[~(checked["signed_change"] > 0), "cell"].tolist()
        raise ValidationFailed(
            f"{exc}\nmoved the wrong way on average (language/voice/condition/measure/contrast): "
            f"{', '.join(wrong[:20])}{' ...' if len(wrong) > 20 else ''}"
        ) from None


def validate_flips(margins: pd.DataFrame) -> ValidationReport:
    """'phonation_carrier' suite: no classifier hears the other gender in any condition."""
    from voicebias.validation import ValidationFailed

    E = expectations()
    try:
        return require_valid(
            margins, "phonation_carrier", [E.ExpectColumnValuesToBeInSet(column="flipped", value_set=[False])]
        )
    except ValidationFailed as exc:
        bad = margins[margins["flipped"]]
        raise ValidationFailed(
            f"{exc}\nclassifier flips (stimulus/classifier/margin): "
            + ", ".join(f"{r.stimulus_id}/{r.classifier}/{r.margin:.2f}" for r in bad.head(20).itertuples())
        ) from None
