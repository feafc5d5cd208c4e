"""The reply screen: which replies of a system can enter the analyses, and why the others cannot.

A reply that cannot be analysed stays in the responses table with status ``excluded``, its reason
code in ``reason`` (contract.REPLY_REASONS) and a readable ``error``; it is counted everywhere and
not asked again. The screen reads the reply alone (`file_facts` of its audio file, the transcript)
and applies the limits each time the table is built, so changing a limit re-screens cached replies
without calling the system. Unvoiced audio is left to the acoustic scoring stage (``no_voicing``).

The reason codes and when each applies: docs/systems.md, "The reply screen".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from voicebias.audio import clipped_fraction, min_analysable_s, rms_dbfs

#: how the screen's audio facts are computed; a change here recomputes them for cached replies
FACTS_VERSION = 1


@dataclass(frozen=True)
class ReplyLimits:
    """The limits a reply's audio must meet (s, Hz, dBFS, fraction of samples); the defaults
    are those of the default acoustics params (`limits_from_params`)."""

    min_duration_s: float = 0.07
    max_duration_s: float = 600.0
    max_reply_ratio: float | None = 4.0
    min_sample_rate: int = 11000
    silence_dbfs: float = -60.0
    max_clipped_fraction: float = 0.001
    clip_level: float = 0.999


def audio_facts(x: np.ndarray | None, sr: int | None, clip_level: float = 0.999) -> dict[str, Any]:
    """What the screen reads of a reply's audio: frames, sample_rate (Hz), duration_s, rms_dbfs,
    clipped_fraction (share of samples at or above `clip_level` of full scale) and finite
    (no NaN or infinite sample); `{"frames": None}` for a reply without audio.

    Examples
    --------
    >>> import numpy as np
    >>> f = audio_facts(np.full(800, 0.5, np.float32), 16000)
    >>> f["duration_s"], round(f["rms_dbfs"], 2), f["clipped_fraction"], f["finite"]
    (0.05, -6.02, 0.0, True)
    """
    if x is None or sr is None:
        return {"version": FACTS_VERSION, "frames": None}
    x = np.asarray(x)
    finite = bool(np.all(np.isfinite(x)))
    mono = x.mean(axis=1) if x.ndim == 2 else x
    level = rms_dbfs(mono) if finite else float("nan")
    return {
        "version": FACTS_VERSION,
        "frames": int(mono.shape[0]),
        "sample_rate": int(sr),
        "duration_s": float(mono.shape[0]) / float(sr) if sr else 0.0,
        "rms_dbfs": float(level) if np.isfinite(level) else None,
        "clipped_fraction": clipped_fraction(np.nan_to_num(x).reshape(-1), clip_level) if x.size else 0.0,
        "finite": finite,
    }


def file_facts(path: str, clip_level: float = 0.999) -> dict[str, Any]:
    """`audio_facts` of an audio file; `{"undecodable": message}` when libsndfile cannot read it."""
    import soundfile as sf

    try:
        x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        return {"version": FACTS_VERSION, "undecodable": f"the reply's audio cannot be decoded ({exc})"}
    return audio_facts(x, sr, clip_level)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u2019", "'").replace("\uff0c", "，")).strip().lower()


def is_refusal(text: str | None, patterns: Sequence[str]) -> str | None:
    """The refusal phrase `text` contains (matched case-insensitively, curly apostrophes as
    straight ones), or None.

    Examples
    --------
    >>> is_refusal("I\u2019m sorry, but I can't help with that request.", ["i can't help with that"])
    "i can't help with that"
    >>> is_refusal("I can't help with the dishes tonight.", ["i can't help with that"]) is None
    True
    """
    if not isinstance(text, str) or not text:
        return None
    t = _normalise(text)
    for p in patterns:
        if _normalise(p) in t:
            return p
    return None


def screen_reply(
    facts: Mapping[str, Any] | None,
    transcript: str | None,
    refusals: Sequence[str],
    limits: ReplyLimits,
    input_duration_s: float | None = None,
) -> tuple[str, str] | None:
    """(reason, message) of a reply the analyses cannot use, or None for a usable one.

    Parameters
    ----------
    facts : mapping
        `audio_facts` (or `file_facts`) of the reply's audio; frames None for none.
    transcript : str or None
        The reply's text.
    refusals : sequence of str
        Refusal phrases of the reply's language.
    limits : ReplyLimits
        The limits of the audio.
    input_duration_s : float, optional
        Length of the stimulus the reply answers (s); with `limits.max_reply_ratio`, a reply
        more than that many times as long is `too_long`.

    Examples
    --------
    >>> lim = ReplyLimits()
    >>> ok = {"frames": 32000, "sample_rate": 16000, "duration_s": 2.0, "rms_dbfs": -23.0,
    ...       "clipped_fraction": 0.0, "finite": True}
    >>> screen_reply(ok, "hello", [], lim) is None
    True
    >>> screen_reply({**ok, "duration_s": 300.0}, "hello", [], lim, input_duration_s=20.0)[0]
    'too_long'
    >>> screen_reply({**ok, "rms_dbfs": None}, "hello", [], lim)[0]
    'silent'
    >>> screen_reply({"frames": None}, "hello", [], lim)
    ('no_audio', 'the system returned text without audio')
    """
    facts = facts or {"frames": None}
    if "undecodable" in facts:
        return "not_audio", str(facts["undecodable"])
    if facts.get("frames") is None:
        return "no_audio", "the system returned text without audio"
    if int(facts["frames"]) == 0:
        return "empty_audio", "the system returned audio with no samples"
    phrase = is_refusal(transcript, refusals)
    if phrase is not None:
        return "refusal", f"the reply declines the task ('{phrase}')"
    if not facts.get("finite", True):
        return "nan", "the reply's audio holds NaN or infinite samples"
    dur = float(facts["duration_s"])
    if dur < limits.min_duration_s:
        return "too_short", (
            f"the reply is {1000 * dur:.0f} ms long, shorter than the {1000 * limits.min_duration_s:.0f} ms "
            "the instrument needs"
        )
    if dur > limits.max_duration_s:
        return "too_long", f"the reply is {dur:.0f} s long (more than {limits.max_duration_s:g} s)"
    if limits.max_reply_ratio is not None and input_duration_s and dur > limits.max_reply_ratio * input_duration_s:
        return "too_long", (
            f"the reply is {dur:.0f} s long, more than {limits.max_reply_ratio:g} times the "
            f"{input_duration_s:.1f} s stimulus it answers"
        )
    sr = int(facts["sample_rate"])
    if sr < limits.min_sample_rate:
        return "low_sample_rate", (
            f"the reply's sample rate {sr} Hz is too low: the analysis needs at least {limits.min_sample_rate} Hz"
        )
    level = facts.get("rms_dbfs")
    if level is None or float(level) < limits.silence_dbfs:
        shown = "-inf" if level is None else f"{float(level):.1f}"
        return "silent", f"the reply is silent (RMS {shown} dBFS, below {limits.silence_dbfs:g} dBFS)"
    clip = float(facts.get("clipped_fraction") or 0.0)
    if clip > limits.max_clipped_fraction:
        return "clipped", (
            f"the reply is clipped: {100 * clip:.2f} % of samples at full scale "
            f"(more than {100 * limits.max_clipped_fraction:g} %)"
        )
    return None


def limits_from_params(params: Mapping[str, Any]) -> ReplyLimits:
    """The reply limits of a parameter mapping: the acoustic instrument's own (the neutral pitch
    floor and time step give the shortest analysable sound, twice the highest formant ceiling
    the lowest sample rate; silence, clipping and longest duration as the acoustics section
    says) and `run.max_reply_ratio`.

    >>> lim = limits_from_params({"acoustics": {"neutral_pitch_range": [60, 500], "time_step": 0.01,
    ...                           "max_formant": {"male": 5500, "female": 5500}, "neutral_max_formant": 5500,
    ...                           "max_duration_s": 600, "silence_dbfs": -60, "max_clipped_fraction": 0.001},
    ...                           "run": {"max_reply_ratio": 4}})
    >>> round(lim.min_duration_s, 6), lim.min_sample_rate, lim.max_reply_ratio
    (0.07, 11000, 4.0)
    """
    from voicebias.params import Acoustics, Run

    # keys a partial mapping leaves out take the schema's documented defaults
    defaults = {k: f.default for k, f in {**Acoustics.model_fields, **Run.model_fields}.items()}
    ac = {**defaults, **(params.get("acoustics") or {})}
    per_gender = ac.get("max_formant")
    ceilings = [float(v) for v in per_gender.values()] if isinstance(per_gender, dict) else []
    ceilings.append(float(ac["neutral_max_formant"]))
    ratio = (params.get("run") or {}).get("max_reply_ratio", defaults["max_reply_ratio"])
    return ReplyLimits(
        min_duration_s=min_analysable_s(float(ac["neutral_pitch_range"][0]), float(ac["time_step"])),
        max_duration_s=float(ac["max_duration_s"]),
        max_reply_ratio=None if ratio is None else float(ratio),
        min_sample_rate=int(round(2 * max(ceilings))),
        silence_dbfs=float(ac["silence_dbfs"]),
        max_clipped_fraction=float(ac["max_clipped_fraction"]),
    )


class ReplyScreen:
    """The screen of one run: its limits and the refusal phrases of each language.

    Called with a reply's audio facts, transcript, language (the reply's: a task's target
    language) and the stimulus length, it gives `screen_reply`'s (reason, message) or None."""

    def __init__(self, limits: ReplyLimits | None = None, refusals: Mapping[str, Sequence[str]] | None = None):
        self.limits = limits or ReplyLimits()
        if refusals is None:
            from voicebias.tasks import load_lexicon

            refusals = load_lexicon().get("refusal") or {}
        self.refusals = {str(k): [str(p) for p in v] for k, v in dict(refusals).items()}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ReplyScreen":
        return cls(limits_from_params(params))

    def __call__(
        self, facts: Mapping[str, Any] | None, transcript: str | None, lang: str, input_duration_s: float | None = None
    ) -> tuple[str, str] | None:
        return screen_reply(facts, transcript, self.refusals.get(lang, ()), self.limits, input_duration_s)
