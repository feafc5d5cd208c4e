"""A voice continuum: one passage's voice moved in equal steps from a male to a female endpoint.

Each step is made offline from a base voice's rendering by the manipulation of Praat's "Change
gender" (formant shift by resampling, pitch by PSOLA, through parselmouth; the duration restored by
WSOLA, so that every step is reproducible): the F0 median is set to the step's target and the
formants are scaled by the ratio that brings the base voice's measured formant index to the step's.
F0 moves in equal semitone steps and the formant scale in equal steps of log ratio between
documented endpoints (Hillenbrand et al., 1995), so one coordinate places a step on both; the F0-only
variant keeps the base voice's formants. Every step is measured again (the manipulation check);
steps off their targets or out of order are counted exclusions with a reason.

Design, endpoints and the check: docs/psychometric.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from voicebias.instruments.jit import kernel

# Hillenbrand et al. (1995), the full measurement table (45 men, 48 women, 12 vowels each;
# ../shared/data/real/hillenbrand1995/orig_vowdata.dat), geometric means over the tokens:
#: F0 of the men's and the women's vowels (Hz)
HILLENBRAND_MEN_F0_HZ = 129.4
HILLENBRAND_WOMEN_F0_HZ = 219.1
#: the women's F1-F3 over the men's (geometric mean of the three formants' ratios)
HILLENBRAND_FORMANT_RATIO = 1.157
#: the men's formant index (mean log2 of F1-F3 over Peterson & Barney's male norms, the
#: instrument's `formant_index`): the male endpoint's formants
HILLENBRAND_MEN_FORMANT_INDEX = 0.032

#: Praat's "Change gender" pitch analysis range (Hz): wide enough for either endpoint and any base voice
PITCH_RANGE_HZ = (60.0, 600.0)


@dataclass(frozen=True)
class Continuum:
    """A voice continuum: `steps` steps from the male endpoint (step 0) to the female endpoint.

    F0 moves from `f0_male_hz` to `f0_female_hz` in equal semitone steps; the formants are
    scaled from 1 to `formant_ratio` (female relative to male) in equal steps of log ratio,
    so the vocal-tract length (inversely proportional to the formant scale) falls from the
    male endpoint's to 1 / formant_ratio of it. `formant_ratio` 1 is the F0-only variant.

    >>> c = Continuum(steps=7, f0_male_hz=120.0, f0_female_hz=240.0, formant_ratio=1.2)
    >>> [round(c.semitones(s), 2) for s in (0, 3, 6)]
    [0.0, 6.0, 12.0]
    >>> round(c.vtl_percent(12.0), 2), round(c.vtl_percent(6.0), 2)
    (-16.67, -8.71)
    """

    steps: int = 7
    f0_male_hz: float = HILLENBRAND_MEN_F0_HZ
    f0_female_hz: float = HILLENBRAND_WOMEN_F0_HZ
    formant_ratio: float = HILLENBRAND_FORMANT_RATIO

    def __post_init__(self) -> None:
        if self.steps < 3:
            raise ValueError(f"a continuum needs at least 3 steps, got {self.steps}")
        if not (0 < self.f0_male_hz < self.f0_female_hz):
            raise ValueError(
                f"the female endpoint's F0 ({self.f0_female_hz} Hz) must be above the male's ({self.f0_male_hz} Hz)"
            )
        if self.formant_ratio < 1:
            raise ValueError(
                f"formant_ratio is the female formant scale over the male's (>= 1), got {self.formant_ratio}"
            )

    @classmethod
    def from_params(cls, p: dict[str, Any]) -> "Continuum":
        """From the `continuum` section: steps, f0_male_hz, f0_female_hz, formant_ratio and
        `variant` ('f0_and_formants', or 'f0_only', which fixes formant_ratio at 1)."""
        variant = p.get("variant", "f0_and_formants")
        if variant not in ("f0_and_formants", "f0_only"):
            raise ValueError(f"continuum.variant must be 'f0_and_formants' or 'f0_only', got {variant!r}")
        return cls(
            steps=int(p.get("steps", 7)),
            f0_male_hz=float(p.get("f0_male_hz", HILLENBRAND_MEN_F0_HZ)),
            f0_female_hz=float(p.get("f0_female_hz", HILLENBRAND_WOMEN_F0_HZ)),
            formant_ratio=1.0 if variant == "f0_only" else float(p.get("formant_ratio", HILLENBRAND_FORMANT_RATIO)),
        )

    @property
    def span_st(self) -> float:
        """The continuum's F0 span in semitones."""
        return 12 * math.log2(self.f0_female_hz / self.f0_male_hz)

    def fraction(self, step: float) -> float:
        """Where step `step` sits between the endpoints (0 male, 1 female)."""
        return float(step) / (self.steps - 1)

    def semitones(self, step: float) -> float:
        """F0 of `step` in semitones above the male endpoint."""
        return self.fraction(step) * self.span_st

    def f0_hz(self, step: float) -> float:
        return self.f0_male_hz * 2 ** (self.semitones(step) / 12)

    def formant_scale(self, step: float) -> float:
        """The formant scale of `step` relative to the male endpoint's."""
        return self.formant_ratio ** self.fraction(step)

    def vtl_percent(self, st: float) -> float:
        """The vocal-tract length at `st` semitones above the male endpoint, in percent change from
        the male endpoint's (negative: shorter). NaN for the F0-only continuum, whose VTL never moves."""
        if self.formant_ratio == 1:
            return float("nan")
        return 100 * (self.formant_ratio ** (-float(st) / self.span_st) - 1)

    def vtl_ratio_percent(self, st_difference: float) -> float:
        """A distance along the continuum in semitones as a VTL ratio, in percent change: how much
        longer (positive) or shorter the tract at x + d is than at x, for any x."""
        return self.vtl_percent(st_difference)

    def targets(
        self, base_formant_index: float, male_formant_index: float = HILLENBRAND_MEN_FORMANT_INDEX
    ) -> pd.DataFrame:
        """Each step's targets: `f0_hz` and `formant_index` (octaves over the male norms). The
        F0-only variant's formant target is the base voice's own index at every step."""
        rows = []
        for s in range(self.steps):
            fi = (
                base_formant_index if self.formant_ratio == 1 else male_formant_index + math.log2(self.formant_scale(s))
            )
            rows.append(
                {"step": s, "x_st": self.semitones(s), "f0_target_hz": self.f0_hz(s), "formant_index_target": fi}
            )
        return pd.DataFrame(rows)


def wsola(x: np.ndarray, sr: int, stretch: float, frame_s: float = 0.04, tolerance_s: float = 0.01) -> np.ndarray:
    """`x` time-stretched by `stretch` (output duration = stretch x input) with pitch and formants
    kept: waveform-similarity overlap-add (Verhelst & Roelands, 1993). Each Hann-windowed frame
    (`frame_s`, half-frame hop) is taken from within `tolerance_s` of its nominal place where it
    best continues the previous frame (cross-correlation). Deterministic: the frame loop is compiled
    with IEEE arithmetic (`voicebias.instruments.jit`), so every processor picks the same frames.

    >>> import numpy as np
    >>> t = np.arange(16000) / 16000
    >>> y = wsola(np.sin(2 * np.pi * 200 * t), 16000, 1.25)
    >>> len(y), round(float(np.abs(np.fft.rfft(y)).argmax() * 16000 / len(y)))
    (20000, 200)
    """
    x = np.asarray(x, float)
    n = int(round(frame_s * sr)) // 2 * 2
    hs = n // 2
    ha = hs / float(stretch)
    tol = int(round(tolerance_s * sr))
    win = np.hanning(n + 1)[:n]
    out_len = int(round(len(x) * stretch))
    frames = int(np.ceil(out_len / hs)) + 1
    tail = max(0, int(np.ceil(frames * ha)) - len(x)) + 2 * n + tol
    pad = np.concatenate([np.zeros(tol + n), x, np.zeros(tail)])
    nominal = np.array([int(round(m * ha)) for m in range(frames)], dtype=np.int64)
    y, norm = _wsola_frames(pad, tol + n, win, nominal, hs, tol)  # x[0] sits at pad[tol + n]
    norm[norm < 1e-8] = 1.0
    return (y / norm)[:out_len]


@kernel
def _wsola_frames(pad, off, win, nominal, hs, tol):  # pragma: no cover - compiled
    """WSOLA's overlap-add (see `wsola`): frame m starts where, within `tol` samples of
    `nominal[m]`, it correlates best with the natural continuation of frame m - 1 (the first
    of equal maxima). Returns the summed windowed frames and the summed windows."""
    n = win.shape[0]
    frames = nominal.shape[0]
    y = np.zeros(frames * hs + n)
    norm = np.zeros(frames * hs + n)
    target = np.empty(n)
    corr = np.empty(2 * tol + 1)
    prev = 0
    for m in range(frames):
        if m == 0:
            start = nominal[0]
        else:
            for i in range(n):  # the natural continuation of the previous frame, windowed
                target[i] = pad[off + prev + hs + i] * win[i]
            lo = nominal[m] - tol
            corr[:] = 0.0
            for i in range(n):  # one sum per lag, each in the order of i
                t = target[i]
                seg = pad[off + lo + i : off + lo + i + 2 * tol + 1]
                for j in range(2 * tol + 1):
                    corr[j] += seg[j] * t
            best = 0
            for j in range(1, 2 * tol + 1):
                if corr[j] > corr[best]:
                    best = j
            start = lo + best
        for i in range(n):
            y[m * hs + i] += win[i] * pad[off + start + i]
            norm[m * hs + i] += win[i]
        prev = start
    return y, norm


def change_gender(x: np.ndarray, sr: int, formant_ratio: float, f0_hz: float) -> np.ndarray:
    """The manipulation of Praat's "Change gender", made reproducible: formants scaled by
    `formant_ratio` and the F0 median set to `f0_hz`, duration and pitch range kept.

    As Praat does, the formants are shifted by resampling (the sound resampled to sr / ratio and
    played at sr: every frequency x ratio, the duration / ratio) and the pitch is set by PSOLA
    (Praat's Manipulation, overlap-add, pitch tier x f0_hz / median). Praat restores the
    duration by PSOLA too, which draws random numbers (its output differs run to run); here the
    sound is first stretched by the ratio with WSOLA (`wsola`), so the resampling brings it back
    to its own duration and the PSOLA step only moves the pitch, which is deterministic. Same
    length and rate as `x`."""
    import parselmouth
    from parselmouth.praat import call

    k = float(formant_ratio)
    x = np.asarray(x, float)
    snd = parselmouth.Sound(wsola(x, sr, k) if k != 1.0 else x, float(sr))
    if k != 1.0:
        snd = call(snd, "Resample", sr / k, 50)
        call(snd, "Override sampling frequency", float(sr))
    floor, ceiling = PITCH_RANGE_HZ[0] * min(k, 1.0), PITCH_RANGE_HZ[1] * max(k, 1.0)
    pitch = call(snd, "To Pitch", 0.01, floor, ceiling)
    median = call(pitch, "Get quantile", 0, 0, 0.5, "Hertz")
    y = np.asarray(snd.values[0], float)
    if np.isfinite(median) and median > 0:
        # the Manipulation's pulses and pitch tier from this same analysis ("Sound & Pitch: To
        # Manipulation"), not from a second one as "Sound: To Manipulation" would run
        manip = call([snd, pitch], "To Manipulation")
        tier = call(manip, "Extract pitch tier")
        if call(tier, "Get number of points") > 0:
            call(tier, "Multiply frequencies", snd.xmin, snd.xmax, float(f0_hz) / median)
            call([tier, manip], "Replace pitch tier")
            y = np.asarray(call(manip, "Get resynthesis (overlap-add)").values[0], float)
    return y[: len(x)] if len(y) >= len(x) else np.pad(y, (0, len(x) - len(y)))


def as_written(y: np.ndarray, sr: int) -> np.ndarray:
    """`y` as the stimulus file holds it (clipped, 16-bit FLAC, read back), so what the check
    measures is what a system hears."""
    import io

    import soundfile as sf

    from voicebias.audio import flac_bytes

    x, _ = sf.read(io.BytesIO(flac_bytes(y, sr)), dtype="float64")
    return x


def _measure(y: np.ndarray, sr: int, settings: Any) -> tuple[float, float]:
    from voicebias.audio import AudioError
    from voicebias.instruments.acoustics import measure_signal

    try:
        m = measure_signal(y, sr, settings)
    except AudioError:
        return float("nan"), float("nan")
    return float(m["f0_median_hz"]), float(m["formant_index"])


def make_continuum(
    x: np.ndarray, sr: int, continuum: Continuum, settings: Any, corrections: int = 2
) -> tuple[list[np.ndarray], pd.DataFrame]:
    """Every step of one base voice's rendering `x`: (audio per step, as its file will hold it; a
    table of targets and measures).

    `settings` are the instrument's MeasureSettings (voice-quality measures are switched off). The
    formant ratio starts at 2 ** (target - base index) and the F0 request at the target; up to
    `corrections` times both are corrected by the measured misses (Praat's F0 median and the
    measured index respond to the request, not exactly as asked), and the attempt nearest its
    targets is kept.
    Columns: step, x_st, f0_target_hz, formant_index_target, formant_ratio, f0_hz, formant_index."""
    settings = replace(settings, voice_quality=False)
    _, base_index = _measure(np.asarray(x, float), sr, settings)
    if not np.isfinite(base_index):
        raise ValueError("the base voice has no measurable formants: no continuum can be made from it")
    targets = continuum.targets(base_index)
    audio, rows = [], []
    for t in targets.to_dict("records"):
        target, f0_target = t["formant_index_target"], t["f0_target_hz"]
        ratio, f0_asked = 2 ** (target - base_index), f0_target
        best: tuple | None = None
        f0 = fi = float("nan")
        for attempt in range(corrections + 1):
            if attempt:  # correct both requests by the measured misses
                if not (np.isfinite(f0) and np.isfinite(fi)):
                    break
                f0_asked *= f0_target / f0
                if continuum.formant_ratio != 1:
                    ratio *= 2 ** (target - fi)
            # the requests are rounded, so that a measure's last bits (which may differ between
            # processors' code paths) do not change what is asked of Praat
            ratio, f0_asked = round(ratio, 5), round(f0_asked, 2)
            y = as_written(change_gender(x, sr, ratio, f0_asked), sr)
            f0, fi = _measure(y, sr, settings)
            miss = max(abs(12 * np.log2(f0 / f0_target)) / F0_TOLERANCE_ST, abs(fi - target) / FORMANT_TOLERANCE_OCT)
            if best is None or (np.isfinite(miss) and not miss >= best[0]):
                best = (miss, y, ratio, f0, fi)
            if miss < 0.5:  # within half of each tolerance: no correction needed
                break
        # the attempt nearest its targets is kept (a correction can overshoot where the formant
        # tracker loses the shifted formants)
        _, y, ratio, f0, fi = best
        audio.append(y)
        rows.append({**t, "formant_ratio": ratio, "f0_hz": f0, "formant_index": fi})
    return audio, pd.DataFrame(rows)


#: default tolerances of the manipulation check
F0_TOLERANCE_ST = 0.5
FORMANT_TOLERANCE_OCT = 0.03


def manipulation_check(
    steps: pd.DataFrame, f0_tolerance_st: float = F0_TOLERANCE_ST, formant_tolerance_oct: float = FORMANT_TOLERANCE_OCT
) -> pd.DataFrame:
    """Check one continuum's measured steps against their targets and their order.

    A step passes when its measured F0 is within `f0_tolerance_st` semitones of its target, its
    formant index within `formant_tolerance_oct` octaves of its target, and both are above those
    of the previous passing step (the F0-only variant's formant index is only held to its target).
    Adds `f0_error_st`, `formant_error_oct`, `passed` and `reason` (empty, or the failed checks:
    `unmeasurable`, `f0_off_target`, `formant_off_target`, `not_monotone`)."""
    out = steps.sort_values("step").reset_index(drop=True).copy()
    out["f0_error_st"] = 12 * np.log2(out["f0_hz"] / out["f0_target_hz"])
    out["formant_error_oct"] = out["formant_index"] - out["formant_index_target"]
    moves_formants = out["formant_index_target"].nunique() > 1
    passed, reasons = [], []
    last_f0, last_fi = -np.inf, -np.inf
    for r in out.to_dict("records"):
        why = []
        if not (np.isfinite(r["f0_hz"]) and np.isfinite(r["formant_index"])):
            why.append("unmeasurable")
        else:
            if abs(r["f0_error_st"]) > f0_tolerance_st:
                why.append("f0_off_target")
            if abs(r["formant_error_oct"]) > formant_tolerance_oct:
                why.append("formant_off_target")
            if r["f0_hz"] <= last_f0 or (moves_formants and r["formant_index"] <= last_fi):
                why.append("not_monotone")
        passed.append(not why)
        reasons.append(", ".join(why))
        if not why:
            last_f0, last_fi = r["f0_hz"], r["formant_index"]
    out["passed"] = passed
    out["reason"] = reasons
    return out
