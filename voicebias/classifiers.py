"""Speaker-gender classifiers returning a graded margin (female minus male).

The margin plays the role of the pre-softmax logit difference z_female - z_male
(S2S paper, App. F): positive means 'sounds female', and it stays graded where a
posterior would pin to 0 or 1.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import pandas as pd

from voicebias.acoustics import hz_to_semitones

REGISTRY: dict[str, str] = {
    "acoustic_norms": "voicebias.classifiers:AcousticNormsClassifier",
}
PLANNED: dict[str, str] = {
    "w2v2_librispeech": "alefiury/wav2vec2-large-xlsr-53-gender-recognition-librispeech (local weights)",
    "w2v2_commonvoice": "prithivMLmods/Common-Voice-Gender-Detection (local weights)",
}


class GenderClassifier(ABC):
    name: str

    @abstractmethod
    def margins(self, measures: pd.DataFrame) -> np.ndarray:
        """Margin z_female - z_male per row (positive = female)."""


@dataclass
class AcousticNormsClassifier(GenderClassifier):
    """Gaussian class-conditional classifier on F0 and the formant index.

    Class means are adult vowel norms from Peterson & Barney (1952, Table II,
    averaged over ten vowels): F0 132 Hz (men) vs 223 Hz (women); F1/F2/F3
    502/1420/2386 Hz vs 625/1694/2783 Hz, i.e. a formant index of 0 vs 0.264
    octaves. The within-gender spreads (`f0_sd_st`, `formant_sd_oct`) are set
    parameters, not estimates. The margin is the log-likelihood ratio
    log p(x|female) - log p(x|male) with equal priors, in nats.
    """

    f0_sd_st: float = 2.0
    formant_sd_oct: float = 0.06
    name: str = "acoustic_norms"

    MALE = {"f0_st": float(hz_to_semitones(132.0)), "formant_index": 0.0}
    FEMALE = {
        "f0_st": float(hz_to_semitones(223.0)),
        "formant_index": float(np.mean(np.log2(np.array([625.0, 1694.0, 2783.0]) / np.array([502.0, 1420.0, 2386.0])))),
    }

    def margins(self, measures: pd.DataFrame) -> np.ndarray:
        f0 = measures["f0_median_st"].to_numpy(float)
        fi = measures["formant_index"].to_numpy(float)

        def loglik(c: dict[str, float]) -> np.ndarray:
            return -0.5 * ((f0 - c["f0_st"]) / self.f0_sd_st) ** 2 - 0.5 * ((fi - c["formant_index"]) / self.formant_sd_oct) ** 2

        return loglik(self.FEMALE) - loglik(self.MALE)


def get_classifier(name: str, **options) -> GenderClassifier:
    if name not in REGISTRY:
        if name in PLANNED:
            raise NotImplementedError(f"classifier '{name}' ({PLANNED[name]}) has no backend in this version")
        raise KeyError(f"unknown classifier '{name}'; available: {', '.join(sorted(REGISTRY))}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
