"""Acoustic measures of a voice (Praat through parselmouth 0.4.7 / Praat 6.1.38).

One row per file, in one tidy table. Every frame-wise measure is a median over
voiced frames (Praat's pitch track), so pauses and unvoiced consonants do not pull
it. Units:

- duration_s (s); voiced_fraction (share of pitch frames that are voiced);
- f0_median_hz (Hz) and f0_median_st (semitones re 100 Hz);
- f1_hz, f2_hz, f3_hz (Hz; by default a discrete all-pole model of the harmonics
  below the formant ceiling, El-Jaroudi & Makhoul, 1991, fitted per voiced frame:
  it holds F1 at high F0, where Praat's Burg analysis is pulled toward a harmonic;
  `formant_method: burg` restores Burg. Accuracy on synthetic vowels: docs/formants.md);
- formant_index (octaves relative to adult-male vowel norms: Peterson & Barney,
  1952, mean F1/F2/F3 over ten American English vowels = 502/1420/2386 Hz), taken
  per voiced frame and summarised by its median;
- h1_h2_db, h1_a3_db and their Iseli-corrected versions (dB), cpps_db (dB),
  hnr_db (dB): see voicebias.instruments.voice_quality for the method.

Settings per voice gender come from the `acoustics` section of params.yaml:
`pitch_range` (floor, ceiling Hz), `max_formant` (Hz), `time_step` (s),
`formant_method` ('dap' or 'burg'); gender-neutral settings for voices that may follow
their input (MeasureSettings.neutral) from `neutral_pitch_range` (Hz),
`neutral_max_formant` (Hz) and `octave_check_st` (semitones); optional
`bandwidths` for the Iseli correction ('hawks_miller', default, or 'measured'),
`cpps_time_step` (s, default 0.002 as in Praat; 0.005 reads within about 0.05 dB
of it at under a third of the time, 0.01 within about 0.15 dB), and audio checks: `max_duration_s`, `max_clipped_fraction`, `silence_dbfs`.

Files that cannot be measured are kept in the table with status 'excluded', a
short `reason` code and the readable `error` (voicebias.audio lists the codes);
conversions applied to accepted files (stereo to mono, resampling) are in `note`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call

from voicebias.audio import AudioChecks, AudioError, load_for_analysis
from voicebias.contract import MEASURE_COLUMNS, VOICE_QUALITY_MEASURES
from voicebias.exceptions import ConfigError, NotFound
from voicebias.instruments.units import hz_to_semitones
from voicebias.instruments.voice_quality import CPPSSettings, cpps_db, harmonic_levels, hnr_db, voiced_intervals

# Peterson & Barney (1952), Table II, adult men, averaged over the ten vowels (Hz).
MALE_FORMANT_NORMS = (502.0, 1420.0, 2386.0)

STATUS_COLUMNS = ["status", "reason", "error", "note"]


@dataclass(frozen=True)
class MeasureSettings:
    """Analysis settings for one voice gender (pitch range and formant ceiling in Hz,
    time step in s) and the checks applied to each file."""

    pitch_floor: float = 60.0
    pitch_ceiling: float = 500.0
    max_formant: float = 5500.0
    time_step: float = 0.01
    max_duration_s: float = 600.0
    max_clipped_fraction: float = 0.001
    silence_dbfs: float = -60.0
    bandwidths: str = "hawks_miller"
    cpps_time_step: float = 0.002
    # H1-H2, H1-A3, CPPS and HNR cost most of the analysis; scoring that needs only
    # F0, formants and classifier margins (RQ1 output deltas) can switch them off.
    voice_quality: bool = True
    # 'dap' (discrete all-pole on the harmonics) or 'burg' (Praat's Burg, five formants).
    formant_method: str = "dap"
    # > 0: fold pitch frames an octave off the track's median back (tolerance, semitones).
    octave_check_st: float = 0.0

    @classmethod
    def for_gender(cls, params: dict[str, Any], gender: str) -> "MeasureSettings":
        if gender not in params["pitch_range"] or gender not in params["max_formant"]:
            raise NotFound(f"acoustics settings have no entry for voice gender '{gender}' "
                           f"(pitch_range: {sorted(params['pitch_range'])}, max_formant: {sorted(params['max_formant'])})")
        floor, ceiling = params["pitch_range"][gender]
        return cls(float(floor), float(ceiling), float(params["max_formant"][gender]), float(params["time_step"]),
                   float(params.get("max_duration_s", cls.max_duration_s)),
                   float(params.get("max_clipped_fraction", cls.max_clipped_fraction)),
                   float(params.get("silence_dbfs", cls.silence_dbfs)),
                   str(params.get("bandwidths", cls.bandwidths)),
                   float(params.get("cpps_time_step", cls.cpps_time_step)),
                   bool(params.get("voice_quality", cls.voice_quality)),
                   str(params.get("formant_method", cls.formant_method)))

    @classmethod
    def neutral(cls, params: dict[str, Any]) -> "MeasureSettings":
        """Settings that do not depend on a voice gender, for voices that may follow
        their input: `neutral_pitch_range` (Hz, default 60-500) with the octave check
        `octave_check_st` (semitones, default 2) and `neutral_max_formant` (Hz, default
        5500)."""
        floor, ceiling = params.get("neutral_pitch_range", (60.0, 500.0))
        both = {"pitch_range": {"any": (floor, ceiling)},
                "max_formant": {"any": params.get("neutral_max_formant", 5500.0)}}
        return replace(cls.for_gender({**params, **both}, "any"),
                       octave_check_st=float(params.get("octave_check_st", 2.0)))

    def checks(self) -> AudioChecks:
        # The signal must carry content up to the formant ceiling: Nyquist >= max_formant.
        return AudioChecks(min_sample_rate=int(np.ceil(2 * self.max_formant)), max_duration_s=self.max_duration_s,
                           max_clipped_fraction=self.max_clipped_fraction, silence_dbfs=self.silence_dbfs)


# Discrete all-pole analysis: model order (five formants plus one pole pair for the
# glottal source), and the poles kept as formants: above the source region and no
# wider than a vowel formant.
DAP_ORDER = 12
DAP_MIN_FORMANT_HZ = 150.0
DAP_MAX_BANDWIDTH_HZ = 700.0
DAP_ITERATIONS = 20
DAP_FRAMES_PER_CHUNK = 256


def harmonic_window_s(f0: np.ndarray, n_periods: float = 4.0, min_window_s: float = 0.025,
                      max_window_s: float = 0.05) -> float:
    """Analysis window (s) for the harmonic spectra of a file: `n_periods` periods of its
    median f0 (Hz), clipped to `min_window_s`..`max_window_s`."""
    return float(np.clip(n_periods / np.median(f0), min_window_s, max_window_s))


def harmonic_power(x: np.ndarray, sr: int, times: np.ndarray, f0: np.ndarray, ceiling: float,
                   window_s: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frequency (Hz) and power (linear, arbitrary common reference) of every harmonic
    k f0 below `ceiling` Hz, per frame.

    times (s) and f0 (Hz) are the voiced frames. A Hann window of `window_s` s
    (default: harmonic_window_s of these frames), zero-padded to four times its length;
    each harmonic is the spectral peak within k f0 +- 0.2 f0, refined by parabolic
    interpolation of the log power. Returns freqs, power and a mask, each of shape
    (frames, harmonics); the mask is False past the ceiling.
    """
    x = np.asarray(x, dtype=np.float64)
    f0 = np.asarray(f0, dtype=float)
    n = int(round((window_s or harmonic_window_s(f0)) * sr)) | 1
    padded = np.concatenate([np.zeros(n // 2), x, np.zeros(n // 2)])
    starts = np.round(np.asarray(times, dtype=float) * sr).astype(int)
    frames = padded[np.clip(starts[:, None] + np.arange(n)[None, :], 0, len(padded) - 1)] * np.hanning(n)
    nfft = 1 << int(np.ceil(np.log2(4 * n)))
    df = sr / nfft
    harmonics = f0[:, None] * np.arange(1, int(ceiling // f0.min()) + 1)[None, :]
    mask = harmonics < ceiling
    reach = np.maximum(1, np.floor(0.2 * f0 / df)).astype(int)
    offsets = np.arange(-reach.max(), reach.max() + 1)
    n_bins = nfft // 2 + 1
    bins = np.clip(np.round(harmonics / df).astype(int)[:, :, None] + offsets, 1, n_bins - 2)
    # power only up to the highest bin a peak search or its interpolation reads
    spec = np.abs(np.fft.rfft(frames, nfft, axis=1)[:, :int(bins.max()) + 2]) ** 2
    rows = np.arange(len(f0))[:, None]
    candidates = np.where(np.abs(offsets) <= reach[:, None, None], spec[rows[:, :, None], bins], -np.inf)
    peak = np.take_along_axis(bins, np.argmax(candidates, axis=2)[:, :, None], 2)[:, :, 0]
    a, b, c = (np.log(spec[rows, peak + d] + 1e-300) for d in (-1, 0, 1))
    denom = a - 2 * b + c
    # at the edge of the search range the peak need not be a local maximum: clip
    shift = np.clip(np.where(denom < 0, 0.5 * (a - c) / np.where(denom < 0, denom, -1.0), 0.0), -0.5, 0.5)
    return (peak + shift) * df, np.exp(b - 0.25 * (a - c) * shift), mask


def discrete_all_pole(freqs: np.ndarray, power: np.ndarray, mask: np.ndarray, ceiling: float, sr: int,
                      order: int = DAP_ORDER, iterations: int = DAP_ITERATIONS,
                      pre_emphasis_hz: float = 50.0) -> np.ndarray:
    """All-pole model fitted to a line spectrum, per frame (El-Jaroudi & Makhoul, 1991).

    freqs (Hz), power and mask as returned by `harmonic_power`. The band 0..`ceiling`
    Hz is the model's full band (as Praat does by resampling to twice the ceiling),
    with Praat's pre-emphasis from `pre_emphasis_hz`. The model minimises the
    Itakura-Saito distance to the harmonic powers alone, so the spectrum between
    harmonics, which a voiced sound does not define, plays no part; linear prediction
    on the autocorrelation of a high-pitched voice instead fits the aliased
    autocorrelation of the harmonics and pulls formants toward them. Starts from
    linear prediction on the harmonics and iterates the paper's fixed-point equations
    (damped by one half). Returns the predictor polynomials, shape (frames, order + 1),
    first coefficient 1.
    """
    alpha = np.exp(-2 * np.pi * pre_emphasis_hz / sr)
    p = np.where(mask, power * np.abs(1 - alpha * np.exp(-2j * np.pi * freqs / sr)) ** 2, 0.0)
    count = mask.sum(axis=1, keepdims=True)
    weights = mask / count
    p = p / np.sum(p * weights, axis=1, keepdims=True)
    w = np.pi * np.where(mask, freqs, 0.0) / ceiling
    lags = np.arange(order + 1)
    # cos(k w) and sin(k w) for every harmonic and lag, by the angle-addition recurrence,
    # lag by lag on contiguous (frames, harmonics) planes, then laid out lag-last
    planes = np.empty((2, order + 1) + w.shape)
    pc, ps = planes
    pc[0], ps[0] = 1.0, 0.0
    c1, s1 = np.cos(w), np.sin(w)
    pc[1], ps[1] = c1, s1
    for k in range(2, order + 1):
        np.subtract(pc[k - 1] * c1, ps[k - 1] * s1, out=pc[k])
        np.add(ps[k - 1] * c1, pc[k - 1] * s1, out=ps[k])
    cos, sin = np.ascontiguousarray(planes.transpose(0, 2, 3, 1))
    r = np.einsum("tik,ti->tk", cos, p * weights)
    r[:, 0] *= 1 + 1e-9
    toeplitz = r[:, np.abs(lags[:order, None] - lags[None, :order])]
    inverse = np.linalg.inv(toeplitz)   # the same matrix at every iteration
    ones = np.ones((len(r), 1))
    a = np.concatenate([ones, (inverse @ -r[:, 1:, None])[:, :, 0]], axis=1)
    for _ in range(iterations):
        # the predictor polynomial A(e^{-jw}) at the harmonics, real and imaginary parts
        re = (cos @ a[:, :, None])[:, :, 0]
        im = -(sin @ a[:, :, None])[:, :, 0]
        re, im = np.where(mask, re, 1.0), np.where(mask, im, 0.0)   # harmonics past the ceiling: 1
        mag = re * re + im * im
        gain = np.sum(p * mag * weights, axis=1)
        q = weights / mag
        model = ((q * re)[:, None, :] @ cos)[:, 0, 1:] - ((q * im)[:, None, :] @ sin)[:, 0, 1:]
        rhs = gain[:, None] * model - r[:, 1:]
        step = np.concatenate([ones, (inverse @ rhs[:, :, None])[:, :, 0]], axis=1)
        converged = np.max(np.abs(step - a)) < 1e-7
        a = 0.5 * (a + step)
        if converged:
            break
    return a


def poles_to_formants(a: np.ndarray, ceiling: float, n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The lowest `n` formant frequencies and bandwidths (Hz) of predictor polynomials
    (frames, order + 1) on the band 0..`ceiling` Hz.

    Poles above DAP_MIN_FORMANT_HZ and narrower than DAP_MAX_BANDWIDTH_HZ come first;
    where fewer than `n` qualify (a spectrum without formant peaks), the other poles
    of the band fill in, lowest first, as Praat's Burg analysis reports them. NaN
    where the band holds fewer than `n` poles."""
    order = a.shape[1] - 1
    companion = np.zeros((len(a), order, order))
    companion[:, 0, :] = -a[:, 1:]
    companion[:, 1:, :-1] = np.eye(order - 1)
    roots = np.linalg.eigvals(companion)
    freq = np.angle(roots) / np.pi * ceiling
    bw = -np.log(np.maximum(np.abs(roots), 1e-300)) / np.pi * 2 * ceiling
    in_band = (roots.imag > 0) & (freq > 50.0) & (freq < ceiling - 50.0)
    formant_like = in_band & (freq > DAP_MIN_FORMANT_HZ) & (bw < DAP_MAX_BANDWIDTH_HZ)
    rank = np.where(formant_like, freq, np.where(in_band, freq + 2 * ceiling, np.inf))
    chosen = np.argsort(rank, axis=1)[:, :n]
    freq = np.where(np.isfinite(np.take_along_axis(rank, chosen, 1)), np.take_along_axis(freq, chosen, 1), np.nan)
    bw = np.where(np.isfinite(freq), np.take_along_axis(bw, chosen, 1), np.nan)
    by_freq = np.argsort(np.where(np.isfinite(freq), freq, np.inf), axis=1)
    return np.take_along_axis(freq, by_freq, 1), np.take_along_axis(bw, by_freq, 1)


def dap_formants(x: np.ndarray, sr: int, times: np.ndarray, f0: np.ndarray,
                 ceiling: float) -> tuple[np.ndarray, np.ndarray]:
    """F1-F3 and B1-B3 (Hz) at voiced frames (times in s, f0 in Hz) by discrete all-pole
    modelling of the harmonics below `ceiling` Hz. Returns two (frames, 3) arrays, NaN
    where a frame yields fewer than three formants."""
    f0 = np.asarray(f0, dtype=float)
    times = np.asarray(times, dtype=float)
    window_s = harmonic_window_s(f0)
    tracks, bandwidths = np.full((len(f0), 3), np.nan), np.full((len(f0), 3), np.nan)
    for i in range(0, len(f0), DAP_FRAMES_PER_CHUNK):
        part = slice(i, i + DAP_FRAMES_PER_CHUNK)
        freqs, power, mask = harmonic_power(x, sr, times[part], f0[part], ceiling, window_s)
        # A floor 120 dB under each frame's strongest harmonic keeps the fit finite where
        # a frame holds digital silence between harmonics.
        loudest = np.max(np.where(mask, power, 0.0), axis=1)
        power = np.maximum(power, 1e-12 * loudest[:, None])
        usable = (mask.sum(axis=1) > DAP_ORDER // 2) & (loudest > 0)
        if not usable.any():
            continue
        with np.errstate(all="ignore"):
            a = discrete_all_pole(freqs[usable], power[usable], mask[usable], ceiling, sr)
        fitted = np.isfinite(a).all(axis=1)
        rows = np.flatnonzero(usable)[fitted] + i
        if rows.size:
            tracks[rows], bandwidths[rows] = poles_to_formants(a[fitted], ceiling)
    return tracks, bandwidths


def correct_octave_jumps(f0: np.ndarray, tolerance_st: float) -> tuple[np.ndarray, int]:
    """Fold pitch frames that sit one octave above or below the track's median (within
    `tolerance_st` semitones of +-12 st) back to the median's octave.

    f0 (Hz) of voiced frames. Returns the corrected f0 (Hz) and the number of frames
    moved. Halving and doubling are the errors a wide pitch range invites; a real
    octave jump of the voice is rare outside creak, which such a range is not used for.
    """
    f0 = np.asarray(f0, dtype=float).copy()
    st = 12.0 * np.log2(f0 / np.median(f0))
    up, down = np.abs(st - 12.0) < tolerance_st, np.abs(st + 12.0) < tolerance_st
    f0[up] /= 2.0
    f0[down] *= 2.0
    return f0, int(up.sum() + down.sum())


def formant_index(f1, f2, f3) -> np.ndarray:
    """Mean log2 ratio of F1-F3 to adult-male norms (octaves; 0 = male norm), per frame."""
    return np.mean(np.log2(np.stack([f1, f2, f3], axis=-1) / np.array(MALE_FORMANT_NORMS)), axis=-1)


#: the parts of the measure set, in the order a file is measured. Each is a unit of the
#: measurement cache (voicebias.instruments.measure_cache): its own settings, its own code.
COMPONENTS = ("pitch", "formants", "harmonics", "cpps", "hnr")
#: the measures (MEASURE_COLUMNS) each component gives; duration_s comes with every read
COMPONENT_MEASURES = {
    "pitch": ("voiced_fraction", "f0_median_hz", "f0_median_st"),
    "formants": ("f1_hz", "f2_hz", "f3_hz", "formant_index"),
    "harmonics": ("h1_h2_db", "h1_h2_corrected_db", "h1_a3_db", "h1_a3_corrected_db"),
    "cpps": ("cpps_db",),
    "hnr": ("hnr_db",),
}
#: the MeasureSettings fields each component reads itself (it also depends on those of the
#: components it builds on: COMPONENT_INPUTS)
COMPONENT_SETTINGS = {
    "pitch": ("pitch_floor", "pitch_ceiling", "time_step", "octave_check_st"),
    "formants": ("max_formant", "formant_method"),
    "harmonics": ("bandwidths",),
    "cpps": ("cpps_time_step",),
    "hnr": (),
}
COMPONENT_INPUTS = {"pitch": (), "formants": ("pitch",), "harmonics": ("pitch", "formants"), "cpps": ("pitch",),
                    "hnr": ("pitch",)}


def component_sources() -> dict[str, list[Any]]:
    """The functions and constants whose source decides each component (and the reader),
    hashed into the measurement cache's keys (voicebias.instruments.measure_cache)."""
    from voicebias import audio
    from voicebias.instruments import cepstrum, harmonicity as hm, measure_cache, units, voice_quality as vq

    return {
        "read": [audio.load_for_analysis, audio.resample, audio.rms_dbfs, audio.clipped_fraction, audio._open,
                 audio._decode, audio._wav_truncation, audio.AudioChecks, measure_cache._read_part],
        "pitch": [_Analysis.pitch, correct_octave_jumps, _pitch_measures, units.hz_to_semitones],
        "formants": [_Analysis.formants, dap_formants, harmonic_power, harmonic_window_s,
                     discrete_all_pole, poles_to_formants, _formant_measures,
                     repr((DAP_ORDER, DAP_MIN_FORMANT_HZ, DAP_MAX_BANDWIDTH_HZ, DAP_ITERATIONS,
                           DAP_FRAMES_PER_CHUNK, MALE_FORMANT_NORMS))],
        "harmonics": [vq.harmonic_levels, vq._peak_levels, vq.iseli_correction_db, vq.hawks_miller_bandwidth,
                      repr((vq._HM_LOW, vq._HM_HIGH)), _harmonic_measures],
        "cpps": [vq.cpps_db, vq.cepstrogram_cpps, vq._window_mean_weights, vq._apply_window_mean, vq._median_rows,
                 vq.voiced_intervals, vq.CPPSSettings, _cpps_measures, cepstrum],
        "hnr": [vq.hnr_db, hm.harmonicity_at, hm.interpolation_weights, hm._coefficient_weights, hm._grid_weights,
                hm._by_piece, hm._chebyshev, hm._refine, hm._from_praat,
                repr((hm.SINC_DEPTH, hm.CHEB_N, hm.SCREEN_STEPS, hm.SCREEN_MARGIN, hm.FLAT)), _hnr_measures],
    }


def components_for(settings: MeasureSettings, wanted: tuple[str, ...] | list[str] | None = None) -> tuple[str, ...]:
    """The components a file is measured with: `wanted` (default all of them) in
    COMPONENTS order, pitch and formants alone when `voice_quality` is off. Pitch and
    formants are always measured: every other component is taken at their frames, and
    a file without them is excluded."""
    chosen = COMPONENTS if wanted is None else tuple(c for c in COMPONENTS if c in wanted)
    unknown = sorted(set(wanted or ()) - set(COMPONENTS))
    if unknown:
        raise ConfigError(f"unknown measure components {unknown}; the instrument has {', '.join(COMPONENTS)}")
    if chosen[:2] != COMPONENTS[:2]:
        raise ConfigError(f"measure components must include pitch and formants, got {list(chosen)}")
    return chosen if settings.voice_quality else COMPONENTS[:2]


class _Analysis:
    """One signal's shared intermediate results (pitch track, formant tracks), computed
    once, on first use, whichever components ask for them."""

    def __init__(self, x: np.ndarray, sr: int, settings: MeasureSettings):
        self.x, self.sr, self.s = x, sr, settings
        self._snd = self._pitch = self._formants = None

    @property
    def snd(self) -> parselmouth.Sound:
        if self._snd is None:
            self._snd = parselmouth.Sound(self.x.astype(np.float64), sampling_frequency=self.sr)
        return self._snd

    def pitch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(all frame times, voiced mask, voiced times, voiced f0 in Hz); AudioError when
        fewer than three frames are voiced."""
        if self._pitch is None:
            s = self.s
            pitch = self.snd.to_pitch(s.time_step, s.pitch_floor, s.pitch_ceiling)
            f0 = pitch.selected_array["frequency"]
            voiced = f0 > 0
            if voiced.sum() < 3:
                raise AudioError("no voiced frames found: silent, noise-only or non-speech audio", code="no_voicing")
            f0_voiced = f0[voiced]
            if s.octave_check_st > 0:
                f0_voiced, _ = correct_octave_jumps(f0_voiced, s.octave_check_st)
            self._pitch = (pitch.xs(), voiced, pitch.xs()[voiced], f0_voiced)
        return self._pitch

    def formants(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(F1-F3 tracks at the voiced frames, measured bandwidths or None), Hz."""
        if self._formants is None:
            s, x, sr = self.s, self.x, self.sr
            _, _, times, f0_voiced = self.pitch()
            measured_bw = None
            if s.formant_method == "dap":
                tracks, measured_bw = dap_formants(x, sr, times, f0_voiced, s.max_formant)
            else:
                formant = self.snd.to_formant_burg(s.time_step, 5, s.max_formant, 0.025, 50.0)
                # Formant tracks at the voiced pitch frames (nearest formant frame).
                idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
                tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3)], axis=1)
                tracks[tracks <= 0] = np.nan
                if s.bandwidths == "measured":
                    ftimes = formant.x1 + idx * formant.dx
                    measured_bw = np.array([[formant.get_bandwidth_at_time(i, t) for i in (1, 2, 3)] for t in ftimes],
                                           dtype=float)
                    measured_bw[~(measured_bw > 0)] = np.nan
            self._formants = (tracks, measured_bw if s.bandwidths == "measured" else None)
        return self._formants


def _pitch_measures(a: _Analysis) -> dict[str, float]:
    _, voiced, _, f0_voiced = a.pitch()
    f0_med = float(np.median(f0_voiced))
    return {"voiced_fraction": float(voiced.mean()), "f0_median_hz": f0_med,
            "f0_median_st": float(hz_to_semitones(f0_med))}


def _formant_measures(a: _Analysis) -> dict[str, float]:
    tracks, _ = a.formants()
    frames = tracks[np.isfinite(tracks).all(axis=1)]
    if len(frames) < 3:
        raise AudioError("no voiced frames with three measurable formants", code="no_voicing")
    formants = [float(v) for v in np.median(frames, axis=0)]
    # The index is taken per frame, then summarised by its median over frames: F2's
    # frame distribution is bimodal (front vs back vowels), so an index built from
    # per-formant medians jumps with the vowel mix of the text.
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    return {"f1_hz": formants[0], "f2_hz": formants[1], "f3_hz": formants[2], "formant_index": index}


def _harmonic_measures(a: _Analysis) -> dict[str, float]:
    _, _, times, f0_voiced = a.pitch()
    tracks, bandwidths = a.formants()
    harmonics = harmonic_levels(a.x, a.sr, times, f0_voiced, tracks, bandwidths)

    def med(col: str) -> float:
        v = harmonics[col].to_numpy(float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    return {c: med(c) for c in COMPONENT_MEASURES["harmonics"]}


def _cpps_measures(a: _Analysis) -> dict[str, float]:
    xs, voiced, _, _ = a.pitch()
    intervals = voiced_intervals(xs, voiced, a.s.time_step)
    return {"cpps_db": cpps_db(a.snd, intervals, CPPSSettings(time_step=a.s.cpps_time_step))}


def _hnr_measures(a: _Analysis) -> dict[str, float]:
    _, _, times, _ = a.pitch()
    return {"hnr_db": hnr_db(a.snd, times, a.s.time_step, a.s.pitch_floor)}


_COMPONENT_FUNCTIONS = {"pitch": _pitch_measures, "formants": _formant_measures, "harmonics": _harmonic_measures,
                        "cpps": _cpps_measures, "hnr": _hnr_measures}


def check_settings(settings: MeasureSettings) -> None:
    """ConfigError for a formant method or bandwidth source the instrument does not know."""
    if settings.bandwidths not in ("hawks_miller", "measured"):
        raise ConfigError(f"acoustics.bandwidths must be 'hawks_miller' or 'measured', not '{settings.bandwidths}'")
    if settings.formant_method not in ("dap", "burg"):
        raise ConfigError(f"acoustics.formant_method must be 'dap' or 'burg', not '{settings.formant_method}'")


def measure_components(x: np.ndarray, sr: int, settings: MeasureSettings,
                       components: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """Measure the given components of one mono signal (sample rate `sr` Hz), in COMPONENTS
    order, sharing the pitch and formant tracks between them.

    Returns {component: {"values": {measure: value}}} for each component measured, or
    {"excluded": [code, message]} for the first one that cannot be measured (an
    AudioError: no voicing, no formants); components after it are not measured."""
    check_settings(settings)
    if sr < 2 * settings.max_formant:
        raise AudioError(f"sample rate {sr} Hz is below twice the formant ceiling ({settings.max_formant:g} Hz)",
                         code="low_sample_rate")
    a = _Analysis(x, sr, settings)
    out: dict[str, dict[str, Any]] = {}
    for name in COMPONENTS:
        if name not in components:
            continue
        try:
            out[name] = {"values": _COMPONENT_FUNCTIONS[name](a)}
        except AudioError as exc:
            out[name] = {"excluded": [exc.code, str(exc)]}
            break
    return out


def measure_signal(x: np.ndarray, sr: int, settings: MeasureSettings) -> dict[str, float]:
    """Measure one mono signal (sample rate `sr` Hz); raises AudioError when it holds no
    voiced speech. Returns the MEASURE_COLUMNS (units in the module docstring)."""
    measured = measure_components(x, sr, settings, components_for(settings))
    row: dict[str, float] = {"duration_s": float(len(x) / sr)}
    for name, rec in measured.items():
        if "excluded" in rec:
            raise AudioError(rec["excluded"][1], code=rec["excluded"][0])
        row.update(rec["values"])
    return {c: row.get(c, float("nan")) for c in MEASURE_COLUMNS}


def measure_file(path: Path | str, settings: MeasureSettings, sample_rate: int = 16000) -> dict[str, Any]:
    """Check, read (mono, resampled to `sample_rate` Hz) and measure one file.

    Returns the measures plus a `note` listing conversions; raises AudioError."""
    loaded = load_for_analysis(path, target_sr=sample_rate, checks=settings.checks())
    return {**measure_signal(loaded.x, loaded.sr, settings), "note": "; ".join(loaded.notes)}


def measure_files(
    jobs: list[tuple],
    sample_rate: int = 16000,
    workers: int | None = None,
    desc: str = "measuring",
    cache_dir: Path | str | None = None,
    components: tuple[str, ...] | list[str] | None = None,
) -> pd.DataFrame:
    """Measure many files on all cores (one process per core, with a progress bar).

    jobs: (id, path, settings) or (id, path, settings, part), part one of
    voicebias.instruments.measure_cache.PARTS ('whole', the default; 'first_half',
    'second_half': the halves of the file as read). Returns one row per id: id, status
    ('ok' or 'excluded'), reason (code), error (readable), note, then MEASURE_COLUMNS
    (NaN for excluded files). A failing file never stops the rest of the batch.

    With `cache_dir`, every component of every file is looked up in the measurement
    cache there first (keyed by the audio's sha256, the part, the sample rate, the
    component's settings and code) and only missing components are measured; the
    counts go to `measure_files.last_counts` and to stderr. `components` (default all)
    names the components a stage uses (components_for); the measures of the others are
    NaN in the table, not measured.
    """
    from voicebias.instruments.measure_cache import MeasureCache, measure_jobs

    cache = MeasureCache(cache_dir) if cache_dir is not None else None
    rows, counts = measure_jobs(jobs, sample_rate, workers or os.cpu_count() or 1, desc, cache, components,
                                sys.modules[__name__])
    measure_files.last_counts = counts
    if cache is not None:
        print(f"{desc}: {counts['files']} files; " + ", ".join(
            f"{c} {counts['measured'][c]} measured / {counts['cached'][c]} cached" for c in COMPONENTS
            if counts['measured'][c] or counts['cached'][c]), file=sys.stderr)
    df = pd.DataFrame(rows, columns=["id", *STATUS_COLUMNS, *MEASURE_COLUMNS])
    for col in ("reason", "error", "note"):
        df[col] = df[col].fillna("").astype(str)
    return df


measure_files.last_counts = {}


def exclusion_counts(measures: pd.DataFrame) -> pd.DataFrame:
    """Counts of excluded files per reason code, plus conversions noted on accepted files.

    Returns columns kind ('excluded' or 'note'), reason, n."""
    rows = [{"kind": "excluded", "reason": r, "n": int(n)}
            for r, n in measures.loc[measures["status"] != "ok", "reason"].value_counts().sort_index().items()]
    notes = measures.loc[measures["status"] == "ok", "note"].fillna("")
    kinds: dict[str, int] = {}
    for note in notes:
        for part in filter(None, (p.strip() for p in str(note).split(";"))):
            key = "resampled" if part.startswith("resampled") else "downmixed" if "averaged to mono" in part else part
            kinds[key] = kinds.get(key, 0) + 1
    rows += [{"kind": "note", "reason": k, "n": n} for k, n in sorted(kinds.items())]
    return pd.DataFrame(rows, columns=["kind", "reason", "n"])


def measure_table(table: pd.DataFrame, path_col: str, id_col: str, gender_col: str, params: dict[str, Any],
                  root: Path, sample_rate: int, desc: str, cache_dir: Path | None = None,
                  components: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """Measure every file of a table with the analysis settings of its voice gender.

    Returns the table joined with the measures, status, reason, error and note columns.
    """
    jobs = [(r[id_col], root / r[path_col], MeasureSettings.for_gender(params, r[gender_col]))
            for _, r in table.iterrows()]
    measures = measure_files(jobs, sample_rate=sample_rate, desc=desc, cache_dir=cache_dir,
                             components=components).rename(columns={"id": id_col})
    return table.merge(measures, on=id_col, how="left")


def classifier_names(acoustics_params: dict[str, Any]) -> list[str]:
    """The `acoustics.classifier` setting as a list (one name or several)."""
    c = acoustics_params["classifier"]
    return [c] if isinstance(c, str) else list(c)


def add_margins(df: pd.DataFrame, acoustics_params: dict[str, Any], root: Path, path_col: str = "path",
                sample_rate: int = 16000) -> pd.DataFrame:
    """Add one margin_<classifier> column (z_female - z_male) per configured classifier.

    Classifiers that listen to the audio (wav2vec2) get the measured files, read as
    16 kHz mono; weights folders come from `acoustics.classifier_weights` and an
    explicit label order, where a checkpoint's config has generic label names, from
    `acoustics.classifier_labels` ({name: {female: i, male: j}}).
    """
    from voicebias.instruments.classifiers import get_classifier
    from voicebias.audio import read_audio

    ok = (df["status"] == "ok").to_numpy()
    weights = acoustics_params.get("classifier_weights") or {}
    labels = acoustics_params.get("classifier_labels") or {}
    audio = None
    for name in classifier_names(acoustics_params):
        options: dict[str, Any] = {"weights": root / weights[name]} if name in weights else {}
        if name in weights and acoustics_params.get("classifier_batch_size"):
            options["batch_size"] = int(acoustics_params["classifier_batch_size"])
        if name in labels:
            options["labels"] = dict(labels[name])
        clf = get_classifier(name, **options)
        if clf.needs_audio and audio is None:
            audio = [read_audio(root / p, target_sr=16000)[0] for p in df.loc[ok, path_col]]
        df[f"margin_{name}"] = np.nan
        if ok.any():
            df.loc[ok, f"margin_{name}"] = clf.margins(df[ok], audio=audio, sample_rate=16000)
    return df
