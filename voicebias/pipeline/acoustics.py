"""Stage 'acoustics'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.instruments.acoustics import add_margins, classifier_names, exclusion_counts, measure_table

#: what the stage's readers use of the inputs' measures: F0 and formants (the classifiers,
#: the femininity composite, the carrier gate, the output deltas); the voice-quality
#: columns of data/measures/measures.csv are left NaN (`voicebias measure` gives them)
COMPONENTS_USED = ("pitch", "formants")


def run_stage(
    params: dict[str, Any],
    *,
    manifest_path: Path,
    out_measures: Path,
    out_reference: Path,
    root: Path,
    measure_cache: Path | None = None,
) -> pd.DataFrame:
    """Stage 'acoustics': measure the input stimuli, add classifier margins and the composite."""
    from voicebias.instruments.composite import composite_measures, femininity_composite, reference_stats
    from voicebias.io import read_table, write_table

    manifest = read_table(manifest_path)
    ac = params["acoustics"]
    cols = ["stimulus_id", "passage_id", "lang", "pole", "voice_gender", "voice_id", "path"]
    if "phonation" in manifest:
        cols.insert(6, "phonation")
    df = measure_table(
        manifest[cols],
        "path",
        "stimulus_id",
        "voice_gender",
        ac,
        root,
        int(params["tts"]["sample_rate"]),
        "measuring stimuli",
        cache_dir=measure_cache,
        components=COMPONENTS_USED,
    )
    names = classifier_names(ac)
    df = add_margins(df, ac, root)
    measures = composite_measures(names, ac["formant_term"])
    reference = reference_stats(df, measures)
    df["composite"] = femininity_composite(df, reference, measures)
    write_table(out_measures, df)
    write_table(out_reference, reference)
    counts = exclusion_counts(df)
    if not counts.empty:
        print("acoustics: " + ", ".join(f"{r.n} {r.kind} ({r.reason})" for r in counts.itertuples()))
    return df
