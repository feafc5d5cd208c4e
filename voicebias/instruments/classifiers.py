"""Speaker-gender classifiers returning a graded margin (female minus male).

The margin plays the role of the logit difference z_female - z_male (S2S paper, App. F): positive
means 'sounds female', and it stays graded where a posterior would pin to 0 or 1. Backends behind
`GenderClassifier.margins`, imported lazily through REGISTRY: `acoustic_norms` (embedded default,
from the measured F0 and vocal-tract index, with a calibrated probability) and the wav2vec2
classifiers `w2v2_librispeech` and `w2v2_commonvoice` (paper profile; local weights only, scored
in batches).

See docs/instrument.md, "Speaker-gender classifiers".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from voicebias.errors import ConfigError
from voicebias.instruments.units import hz_to_semitones
from voicebias.registry import Registry

# Published checkpoints behind the registered wav2vec2 names (S2S paper, App. F).
CHECKPOINTS: dict[str, str] = {
    "w2v2_librispeech": "alefiury/wav2vec2-large-xlsr-53-gender-recognition-librispeech",
    "w2v2_commonvoice": "prithivMLmods/Common-Voice-Gender-Detection",
}
# Classifiers named by a profile that this version has no backend for (none at present).
PLANNED: dict[str, str] = {}
REGISTRY = Registry(
    "classifier",
    {
        "acoustic_norms": "voicebias.instruments.classifiers:AcousticNormsClassifier",
        "w2v2_librispeech": (
            "voicebias.instruments.classifiers:Wav2Vec2GenderClassifier",
            {"checkpoint": CHECKPOINTS["w2v2_librispeech"]},
        ),
        "w2v2_commonvoice": (
            "voicebias.instruments.classifiers:Wav2Vec2GenderClassifier",
            {"checkpoint": CHECKPOINTS["w2v2_commonvoice"]},
        ),
    },
    planned=PLANNED,
)

FEMALE_LABELS = {"female", "f", "woman", "women"}
MALE_LABELS = {"male", "m", "man", "men"}


class GenderClassifier(ABC):
    """A speaker-gender classifier; `needs_audio` says whether it listens to the signal."""

    name: str
    needs_audio: bool = False

    @abstractmethod
    def margins(
        self, measures: pd.DataFrame, audio: Sequence[np.ndarray] | None = None, sample_rate: int = 16000
    ) -> np.ndarray:
        """Margin z_female - z_male per row (positive = female).

        measures: the acoustic measures table (one row per file); audio: the mono
        signals of those rows, in order, for classifiers that listen to them.
        """


#: Speaking-F0 norms of adult read speech: 120 Hz (men) and 210 Hz (women), the typical values
#: Traunmueller & Eriksson (1995) give from the published production data.
READ_SPEECH_F0_HZ = {"male": 120.0, "female": 210.0}
#: Between-speaker spreads and vocal-tract norms from the published measurement table of Hillenbrand
#: et al. (1995, vowdata.dat), per talker over the 12 vowels, for the 35 men and 38 women who are not
#: among the test talkers of tests/fixtures/real (tests/unit/instruments/test_real_voices.py recomputes
#: them): F0 SD in semitones; mean and SD (octaves) of the vocal-tract index of the published F3 and F4
#: (voicebias.instruments.formants.vtl_index, tokens with both).
VOWEL_TABLE_NORMS = {
    "male": {"f0_sd_st": 2.4495, "vtl_index": -0.013110, "vtl_sd_oct": 0.055554},
    "female": {"f0_sd_st": 1.6456, "vtl_index": 0.201462, "vtl_sd_oct": 0.050657},
}
#: The slope a of the calibrated log-odds a * LLR (Platt scaling through the origin, so the equal-prior
#: boundary stays where the norms put it), by maximum likelihood on the 727 tokens of those 73 talkers
#: that have F0, F3 and F4: one token's LLR overstates the evidence about five-fold.
CALIBRATION_SLOPE = 0.2070


@dataclass(frozen=True)
class Norm:
    """One sex's class-conditional normal: F0 (semitones re 100 Hz) and the vocal-tract index
    (octaves), independent."""

    f0_st: float
    f0_sd_st: float
    vtl: float
    vtl_sd_oct: float

    def loglik(self, f0_st: np.ndarray, vtl: np.ndarray) -> np.ndarray:
        """Log density (nats, up to the constant both classes share) of the measured values."""
        return (
            -0.5 * ((f0_st - self.f0_st) / self.f0_sd_st) ** 2
            - np.log(self.f0_sd_st)
            - 0.5 * ((vtl - self.vtl) / self.vtl_sd_oct) ** 2
            - np.log(self.vtl_sd_oct)
        )


def _norm(sex: str) -> Norm:
    t = VOWEL_TABLE_NORMS[sex]
    return Norm(
        f0_st=float(hz_to_semitones(READ_SPEECH_F0_HZ[sex])),
        f0_sd_st=t["f0_sd_st"],
        vtl=t["vtl_index"],
        vtl_sd_oct=t["vtl_sd_oct"],
    )


@dataclass
class AcousticNormsClassifier(GenderClassifier):
    """Gaussian class-conditional classifier on the median F0 and the vocal-tract index, with equal priors.

    F0 carries the read-speech norms (READ_SPEECH_F0_HZ); the vocal-tract index (F3 and F4,
    voicebias.instruments.formants.vtl_index) stands for vocal-tract length, because the higher
    formants move least with what is said (Lammert & Narayanan, 2015) and read speech sits where the
    vowel table does on them, while F1 and F2 are centralised in running speech.
    The margin is the calibrated log-odds CALIBRATION_SLOPE * (log p(x|female) - log p(x|male)), and
    `probability` its posterior P(female) = 1 / (1 + exp(-margin)). Norms and calibration:
    docs/accuracy.md, "The acoustic-norms classifier".
    """

    name: str = "acoustic_norms"

    MALE = _norm("male")
    FEMALE = _norm("female")

    def margins(
        self, measures: pd.DataFrame, audio: Sequence[np.ndarray] | None = None, sample_rate: int = 16000
    ) -> np.ndarray:
        f0 = measures["f0_median_st"].to_numpy(float)
        vtl = measures["vtl_index"].to_numpy(float)
        return CALIBRATION_SLOPE * self.log_likelihood_ratio(f0, vtl)

    def log_likelihood_ratio(self, f0_st: np.ndarray, vtl: np.ndarray) -> np.ndarray:
        """log p(x|female) - log p(x|male) (nats) of F0 (semitones re 100 Hz) and the vocal-tract index."""
        return self.FEMALE.loglik(f0_st, vtl) - self.MALE.loglik(f0_st, vtl)

    def probability(self, measures: pd.DataFrame) -> np.ndarray:
        """P(female | F0, vocal-tract index) under the norms, equal priors."""
        return 1.0 / (1.0 + np.exp(-self.margins(measures)))


def label_indices(id2label: dict[Any, str], labels: dict[str, int] | None = None) -> tuple[int, int]:
    """(female index, male index) of a two-class label map.

    The indices are found from the label names ('female'/'male', case-insensitive).
    A checkpoint whose config carries generic names ('LABEL_0', 'LABEL_1') needs the
    order stated explicitly in `labels` ({'female': i, 'male': j}, e.g. from its model
    card); named labels that contradict `labels` are refused.
    """
    names = {int(k): str(v) for k, v in id2label.items()}
    if len(names) != 2:
        raise ConfigError(f"expected a two-class (female/male) classifier, got labels {names}")
    found: dict[str, int] = {}
    for idx, lab in names.items():
        low = lab.strip().lower()
        if low in FEMALE_LABELS:
            found["female"] = idx
        elif low in MALE_LABELS:
            found["male"] = idx
    if labels is not None:
        want = {"female": int(labels["female"]), "male": int(labels["male"])}
        if set(want.values()) != set(names):
            raise ConfigError(f"stated label order {want} does not match the checkpoint's classes {sorted(names)}")
        for k, v in found.items():
            if want[k] != v:
                raise ConfigError(
                    f"label map mismatch: the checkpoint names class {v} '{names[v]}', "
                    f"but the stated order puts {k} at {want[k]} (id2label={names})"
                )
        return want["female"], want["male"]
    if set(found) != {"female", "male"}:
        raise ConfigError(
            f"cannot tell female from male in id2label={names}; state the order "
            "({'female': i, 'male': j}) from the model card"
        )
    return found["female"], found["male"]


class Wav2Vec2GenderClassifier(GenderClassifier):
    """A transformers Wav2Vec2ForSequenceClassification checkpoint in a local folder.

    The folder holds config.json, the weights and preprocessor_config.json (as
    written by `save_pretrained` / `huggingface-cli download --local-dir`). It is
    loaded with local_files_only=True: nothing is fetched at run time. The label map
    (config.id2label) is checked at load and the female/male indices taken from it.

    Inference: 16 kHz mono input, batches of `batch_size` (on the GPU when one is
    visible), returned in input order. How clips are batched depends on the
    checkpoint's feature encoder (`config.feat_extract_norm`):

    - "layer" (e.g. XLS-R large): clips are sorted by length, so a batch holds
      clips of similar length, zero-padded to the longest, and the attention mask
      goes with them (`return_attention_mask=True`, whatever the checkpoint's
      preprocessor_config says). The mask keeps padding out of the input
      normalisation, the positional convolution and the attention, and
      `Wav2Vec2ForSequenceClassification` pools only the unpadded frames, so a
      padded clip scores as it does alone (to float rounding).
    - "group" (e.g. wav2vec2-base): the first convolution's group norm
      normalises each channel over the whole padded length, so padding changes
      the output with or without a mask (the transformers docs say such models
      take zero padding and no mask). These are batched only with clips of
      identical length, i.e. mostly one at a time.

    Either way a clip's margin does not depend on the batch it is in.
    """

    needs_audio = True

    def __init__(
        self,
        weights: str | Path | None = None,
        name: str = "wav2vec2",
        source: str = "",
        batch_size: int = 8,
        device: str | None = None,
        labels: dict[str, int] | None = None,
    ):
        self.name = name
        if weights is None:
            raise ConfigError(
                f"classifier '{name}' needs a local weights folder: set "
                f"acoustics.classifier_weights.{name} in params.yaml"
            )
        folder = Path(weights)
        hint = (
            f" (download {source} there, e.g. `huggingface-cli download {source} --local-dir {folder}`)"
            if source
            else ""
        )
        if not folder.is_dir():
            raise FileNotFoundError(f"classifier '{name}': weights folder {folder} not found{hint}")
        for needed in ("config.json", "preprocessor_config.json"):
            if not (folder / needed).exists():
                raise FileNotFoundError(f"classifier '{name}': {folder} has no {needed}{hint}")
        import torch
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

        self.folder, self.batch_size = folder, int(batch_size)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.extractor = Wav2Vec2FeatureExtractor.from_pretrained(str(folder), local_files_only=True)
        self.model = Wav2Vec2ForSequenceClassification.from_pretrained(str(folder), local_files_only=True)
        self.model.eval().to(self.device)
        self.female_index, self.male_index = label_indices(self.model.config.id2label, labels)
        self.sampling_rate = int(self.extractor.sampling_rate)
        #: padded batches with an attention mask (layer-norm feature encoders only; see the class docstring)
        self.masked_batches = getattr(self.model.config, "feat_extract_norm", "group") == "layer"

    def logits(self, audio: Sequence[np.ndarray], sample_rate: int = 16000) -> np.ndarray:
        """Pre-softmax logits, shape (n_clips, 2), in the checkpoint's class order."""
        import torch

        from voicebias.audio import resample

        clips = [resample(np.asarray(a, dtype=np.float32), sample_rate, self.sampling_rate) for a in audio]
        out = np.full((len(clips), 2), np.nan)
        if self.masked_batches:
            # sorted by length: each batch pads its clips to the longest of similar lengths
            order = sorted(range(len(clips)), key=lambda i: len(clips[i]))
            batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            mask: dict[str, bool] = {"return_attention_mask": True}
        else:
            by_len: dict[int, list[int]] = {}
            for i, c in enumerate(clips):
                by_len.setdefault(len(c), []).append(i)
            batches = [
                ids[i : i + self.batch_size] for ids in by_len.values() for i in range(0, len(ids), self.batch_size)
            ]
            mask = {}  # equal lengths, nothing padded: the extractor's own setting
        with torch.inference_mode():
            for ids in batches:
                feats = self.extractor(
                    [clips[i] for i in ids], sampling_rate=self.sampling_rate, padding=True, return_tensors="pt", **mask
                )
                # float inputs in the dtype the model loaded in (its config may declare float16)
                feats = {
                    k: v.to(self.device, dtype=self.model.dtype) if v.is_floating_point() else v.to(self.device)
                    for k, v in feats.items()
                }
                out[ids] = self.model(**feats).logits.float().cpu().numpy()
        return out

    def margins(
        self, measures: pd.DataFrame, audio: Sequence[np.ndarray] | None = None, sample_rate: int = 16000
    ) -> np.ndarray:
        if audio is None:
            raise ValueError(f"classifier '{self.name}' listens to the audio: pass the signals")
        if len(audio) != len(measures):
            raise ValueError(f"classifier '{self.name}': {len(audio)} signals for {len(measures)} rows")
        z = self.logits(audio, sample_rate)
        return z[:, self.female_index] - z[:, self.male_index]


def get_classifier(name: str, **options) -> GenderClassifier:
    """Instantiate a registered classifier; options go to its constructor (e.g. weights=folder)."""
    cls = REGISTRY.get(name)
    checkpoint = REGISTRY.meta(name).get("checkpoint")
    if checkpoint:
        options = {"name": name, "source": checkpoint, **options}
    return cls(**options)
