"""Simulated speech-to-speech tables shaped like the real design.

3 languages x 3 content poles x `passages` passages per pole, each passage voiced by
a male and a female voice (stimulus = passage x voice), as the stimulus manifest of
the embedded default (10 passages per cell). Describe rows follow the scored table
(voicebias.scoring.text: one judged_gender per stimulus and system); acoustic rows follow
voicebias.scoring.acoustic.score_outputs (delta = output - input, one row per
system x task x stimulus).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LANGS = ("en", "es", "zh")
POLES = ("masculine", "neutral", "feminine")
VOICES = ("male", "female")
STEP = {"masculine": 0.0, "neutral": 1.0, "feminine": 2.0}
STEREOTYPE_SIGN = {"masculine": -1.0, "neutral": 0.0, "feminine": 1.0}
SAME_LANGUAGE_TASKS = ("readback", "paraphrase", "summarize")


def stimuli(passages: int = 10, langs: tuple[str, ...] = LANGS) -> pd.DataFrame:
    """The stimulus manifest: lang, pole, passage_id, voice_gender, stimulus_id."""
    rows = [
        {
            "lang": lang,
            "pole": pole,
            "passage_id": f"{lang}-{pole}-{i:02d}",
            "voice_gender": voice,
            "stimulus_id": f"{lang}-{pole}-{i:02d}-{voice}",
        }
        for lang in langs
        for pole in POLES
        for i in range(passages)
        for voice in VOICES
    ]
    return pd.DataFrame(rows)


def describe_table(
    rng: np.random.Generator,
    intercept: float = -1.5,
    content_logit: float = 0.0,
    voice_logit: float = 3.0,
    passages: int = 10,
    noncompliance: float = 0.02,
    system: str = "s",
) -> pd.DataFrame:
    """Scored describe answers with logit P(female) = intercept + content_logit x step + voice_logit x female voice.

    step is the content ordinal (masculine 0, neutral 1, feminine 2); the odds ratio per
    step is exp(content_logit). A share `noncompliance` of answers names no gender.
    """
    d = stimuli(passages)
    eta = intercept + content_logit * d["pole"].map(STEP).to_numpy() + voice_logit * (d["voice_gender"] == "female")
    female = rng.random(len(d)) < 1 / (1 + np.exp(-eta.to_numpy(float)))
    judged = np.where(female, "female", "male").astype(object)
    judged[rng.random(len(d)) < noncompliance] = "none"
    return d.assign(system=system, task="describe", status="ok", judged_gender=judged)


def misgender_table(
    rng: np.random.Generator, rate: dict[str, float], passages: int = 10, system: str = "s"
) -> pd.DataFrame:
    """Scored describe answers misgendering the input voice with probability rate[cell type]
    (aligned, neutral, misaligned), every answer compliant."""
    from voicebias.analysis.stats import cell_type

    d = stimuli(passages)
    p = np.array([rate[cell_type(pl, v)] for pl, v in zip(d["pole"], d["voice_gender"])])
    wrong = rng.random(len(d)) < p
    other = d["voice_gender"].map({"male": "female", "female": "male"})
    judged = np.where(wrong, other, d["voice_gender"])
    return d.assign(system=system, task="describe", status="ok", judged_gender=judged)


def acoustic_table(
    rng: np.random.Generator,
    n_systems: int = 1,
    drift: tuple[float, ...] | None = None,
    passages: int = 10,
    tasks: tuple[str, ...] = ("readback", "paraphrase", "summarize", "translate"),
    input_passage_sd: float = 0.5,
    input_sd: float = 0.4,
    output_passage_sd: float = 0.3,
    output_sd: float = 0.2,
    interaction: float = 0.0,
) -> pd.DataFrame:
    """Acoustic deltas (column delta_f0_median_st, copied to delta_composite) of fixed-voice systems.

    input (per stimulus) = voice offset + passage effect (sd input_passage_sd, shared by the
    passage's two voices) + stimulus noise (sd input_sd). output (per system x task x
    stimulus) = system offset + text effect of the passage (sd output_passage_sd, the same
    for every system, task and voice: one fixed output voice speaking the same text)
    + drift[system] x stereotype sign of the pole (+1 feminine, -1 masculine)
    + `interaction` for the male voice on feminine content + noise (sd output_sd).
    delta = output - input, as score_outputs. Every system reads the same inputs, so
    its deltas share the input's variation: systems are not independent replicates.
    """
    drift = drift if drift is not None else (0.0,) * n_systems
    d = stimuli(passages)
    p_in = {p: rng.normal(0, input_passage_sd) for p in d["passage_id"].unique()}
    p_out = {p: rng.normal(0, output_passage_sd) for p in d["passage_id"].unique()}
    base = d["voice_gender"].map({"male": 0.0, "female": 12.0}).to_numpy()
    inp = base + d["passage_id"].map(p_in).to_numpy() + rng.normal(0, input_sd, len(d))
    text = d["passage_id"].map(p_out).to_numpy()
    sign = d["pole"].map(STEREOTYPE_SIGN).to_numpy()
    extra = interaction * ((d["voice_gender"] == "male") & (d["pole"] == "feminine")).to_numpy()
    parts = []
    for k in range(n_systems):
        for task in tasks:
            out = 8.0 + 0.3 * k + text + drift[k] * sign + extra + rng.normal(0, output_sd, len(d))
            delta = out - inp
            parts.append(
                d.assign(system=f"sys{k + 1}", task=task, status="ok", delta_f0_median_st=delta, delta_composite=delta)
            )
    return pd.concat(parts, ignore_index=True)
