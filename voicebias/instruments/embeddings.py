"""Speaker embeddings and cosine similarity (speaker similarity of prompts and outputs).

Two backends behind one interface (`SpeakerEmbedder.embed`), imported lazily:

- `resemblyzer` (embedded default): the GE2E speaker encoder (Wan et al., 2018)
  that the `resemblyzer` wheel ships (pretrained.pt, 256-dim, 16 kHz), so it runs
  offline. Its own preprocessing is applied: loudness normalisation to -30 dBFS
  and removal of long silences with the WebRTC voice activity detector.
- `ecapa` (paper profile): SpeechBrain's ECAPA-TDNN (`speechbrain/spkrec-ecapa-voxceleb`,
  192-dim, 16 kHz), loaded from a local folder holding hyperparams.yaml,
  embedding_model.ckpt, mean_var_norm_emb.ckpt, classifier.ckpt and
  label_encoder.txt (`acoustics.speaker_embedding_weights`); nothing is fetched.

Embeddings are returned as float64 arrays; similarities are cosines in [-1, 1].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from voicebias.audio import AudioError, resample
from voicebias.exceptions import ConfigError, StageFailed
from voicebias.registry import Registry

REGISTRY = Registry("speaker embedding", {
    "resemblyzer": "voicebias.instruments.embeddings:ResemblyzerEmbedder",
    "ecapa": "voicebias.instruments.embeddings:EcapaEmbedder",
})
CHECKPOINTS: dict[str, str] = {"ecapa": "speechbrain/spkrec-ecapa-voxceleb"}


class SpeakerEmbedder(ABC):
    """Turns a mono signal into a fixed-size speaker embedding."""

    name: str
    dim: int
    sampling_rate: int = 16000

    @abstractmethod
    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        """Embedding of one mono float32 signal at `sampling_rate` Hz."""

    def embed(self, x: np.ndarray, sr: int) -> np.ndarray:
        """Embedding (shape (dim,)) of one mono signal at `sr` Hz."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise AudioError("speaker embedding needs a non-empty mono signal", code="empty")
        return np.asarray(self._embed16k(resample(x, sr, self.sampling_rate)), dtype=np.float64).reshape(-1)

    def embed_many(self, signals: Sequence[np.ndarray], sr: int) -> np.ndarray:
        """Embeddings of several signals, shape (n, dim)."""
        return np.stack([self.embed(x, sr) for x in signals]) if len(signals) else np.zeros((0, self.dim))


class ResemblyzerEmbedder(SpeakerEmbedder):
    """GE2E speaker encoder shipped inside the `resemblyzer` package (256-dim)."""

    name, dim = "resemblyzer", 256

    def __init__(self, device: str = "cpu"):
        try:
            from resemblyzer import VoiceEncoder
        except ImportError as exc:
            raise StageFailed("the 'resemblyzer' embedder needs the resemblyzer package "
                               "(pip install --no-deps resemblyzer==0.1.4 webrtcvad-wheels librosa)") from exc
        self.encoder = VoiceEncoder(device, verbose=False)

    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        from resemblyzer import preprocess_wav

        wav = preprocess_wav(x, source_sr=self.sampling_rate)
        if wav.size < self.sampling_rate // 10:
            raise AudioError("no speech found by the voice activity detector (Resemblyzer preprocessing)",
                             code="no_voicing")
        return self.encoder.embed_utterance(wav)


class EcapaEmbedder(SpeakerEmbedder):
    """SpeechBrain ECAPA-TDNN speaker encoder loaded from a local folder (192-dim)."""

    name, dim = "ecapa", 192

    def __init__(self, weights: str | Path | None = None, device: str | None = None, savedir: str | Path | None = None):
        source = CHECKPOINTS["ecapa"]
        if weights is None:
            raise ConfigError("the 'ecapa' embedder needs a local weights folder: set "
                             "acoustics.speaker_embedding_weights in params.yaml")
        folder = Path(weights).resolve()
        hint = f" (download {source} there, e.g. `huggingface-cli download {source} --local-dir {folder}`)"
        if not folder.is_dir():
            raise FileNotFoundError(f"speaker embedding 'ecapa': weights folder {folder} not found{hint}")
        for needed in ("hyperparams.yaml", "embedding_model.ckpt"):
            if not (folder / needed).exists():
                raise FileNotFoundError(f"speaker embedding 'ecapa': {folder} has no {needed}{hint}")
        import torch
        from speechbrain.inference.speaker import EncoderClassifier

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # `pretrained_path` in hyperparams.yaml points at the hub; overriding it with the
        # folder makes the pretrainer read every checkpoint from disk. SpeechBrain links
        # the files into `savedir`: keep that out of the (DVC-tracked) weights folder.
        if savedir is None:
            from voicebias.config import CACHE_DIR

            savedir = CACHE_DIR / "speechbrain" / folder.name
        self.model = EncoderClassifier.from_hparams(
            source=str(folder), savedir=str(savedir), overrides={"pretrained_path": str(folder)},
            run_opts={"device": self.device},
        )
        self.model.eval()

    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            emb = self.model.encode_batch(torch.from_numpy(x)[None])
        return emb.reshape(-1).float().cpu().numpy()


def get_embedder(name: str, **options) -> SpeakerEmbedder:
    """Instantiate a registered speaker embedder ('resemblyzer' or 'ecapa', weights=folder)."""
    return REGISTRY.get(name)(**options)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of the angle between two embeddings (1 = same direction)."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"embeddings differ in size: {a.shape[0]} vs {b.shape[0]}")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        raise ValueError("cosine similarity of a zero vector is undefined")
    return float(a @ b / (na * nb))


def cosine_matrix(A: np.ndarray, B: np.ndarray | None = None) -> np.ndarray:
    """Pairwise cosines between the rows of A and of B (or of A with itself), shape (len(A), len(B))."""
    A = np.atleast_2d(np.asarray(A, dtype=float))
    B = A if B is None else np.atleast_2d(np.asarray(B, dtype=float))
    An = A / np.linalg.norm(A, axis=1, keepdims=True)
    Bn = B / np.linalg.norm(B, axis=1, keepdims=True)
    return An @ Bn.T


def speaker_similarity(pairs: pd.DataFrame, embedder: SpeakerEmbedder, reference_col: str = "reference_path",
                       output_col: str = "output_path", root: Path | None = None) -> pd.DataFrame:
    """Cosine speaker similarity for each (reference, output) pair of audio files.

    Returns the pairs table with `speaker_similarity` (cosine), `status` ('ok' or
    'excluded') and `error`; a bad file excludes its pair, not the batch.
    """
    from voicebias.audio import read_audio

    cache: dict[str, np.ndarray] = {}

    def emb(path: str) -> np.ndarray:
        if path not in cache:
            x, sr = read_audio((root / path) if root else path)
            cache[path] = embedder.embed(x, sr)
        return cache[path]

    sims, status, errors = [], [], []
    for r in pairs.itertuples(index=False):
        try:
            sims.append(cosine_similarity(emb(str(getattr(r, reference_col))), emb(str(getattr(r, output_col)))))
            status.append("ok")
            errors.append("")
        except AudioError as exc:
            sims.append(np.nan)
            status.append("excluded")
            errors.append(str(exc))
    return pairs.assign(speaker_similarity=sims, status=status, error=errors)


def embedder_from_params(acoustics: dict[str, Any], root: Path | None = None) -> SpeakerEmbedder:
    """The speaker embedder named by `acoustics.speaker_embedding` (weights folder from
    `acoustics.speaker_embedding_weights`, relative to the project root)."""
    name = acoustics["speaker_embedding"]
    weights = acoustics.get("speaker_embedding_weights")
    if name == "ecapa":
        w = Path(weights) if weights else None
        return get_embedder(name, weights=(Path(root) / w if root and w and not w.is_absolute() else w))
    return get_embedder(name)
