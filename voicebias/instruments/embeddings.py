"""Speaker embeddings and cosine similarity (speaker similarity of prompts and outputs).

Two backends behind `SpeakerEmbedder.embed`, imported lazily: `resemblyzer` (embedded default,
the GE2E encoder, 256-dim) and `ecapa` (paper profile, SpeechBrain's ECAPA-TDNN, 192-dim, from a
local folder). `embed_each` embeds several signals (ECAPA in padded batches, every clip getting the
embedding it gets alone); on the CPU an embedder runs on one thread and `embed_files` spreads the
files over worker processes, so an embedding is the same on any machine.

See docs/instrument.md, "Speaker embeddings".
"""

from __future__ import annotations

import functools
import hashlib
import os
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from voicebias.audio import AudioError, resample, sha256_file
from voicebias.errors import ConfigError, StageFailed
from voicebias.registry import Registry

REGISTRY = Registry(
    "speaker embedding",
    {
        "resemblyzer": "voicebias.instruments.embeddings:ResemblyzerEmbedder",
        "ecapa": "voicebias.instruments.embeddings:EcapaEmbedder",
    },
)
CHECKPOINTS: dict[str, str] = {"ecapa": "speechbrain/spkrec-ecapa-voxceleb"}


CPU_THREADS = 1


@contextmanager
def _torch_threads(n: int | None):
    """PyTorch's intra-op threads set to `n` for the block (None: left as they are)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            torch.set_num_threads(before)


class SpeakerEmbedder(ABC):
    """Turns a mono signal into a fixed-size speaker embedding."""

    name: str
    dim: int
    sampling_rate: int = 16000
    device: str = "cpu"

    @property
    def on_cpu(self) -> bool:
        """Whether the model runs on the CPU (one thread, files spread over processes)."""
        return not str(self.device).startswith("cuda")

    def _threads(self):
        return _torch_threads(CPU_THREADS if self.on_cpu else None)

    def identity(self) -> dict[str, Any]:
        """What decides an embedding besides the audio: the embedder's name, the sha256 of
        its weights and of its code, and settings that change the floats (device, batch).
        Part of every embedding-cache key (`embed_files`)."""
        import inspect

        code = hashlib.sha256()
        for obj in (type(self), SpeakerEmbedder, resample):
            code.update(inspect.getsource(obj).encode())
        threads = {"torch_threads": CPU_THREADS, "mkl_cbwr": os.environ.get("MKL_CBWR")} if self.on_cpu else {}
        return {"name": self.name, "code": code.hexdigest(), **threads, **self._identity()}

    def _identity(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        """Embedding of one mono float32 signal at `sampling_rate` Hz."""

    def embed(self, x: np.ndarray, sr: int) -> np.ndarray:
        """Embedding (shape (dim,)) of one mono signal at `sr` Hz."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise AudioError("speaker embedding needs a non-empty mono signal", code="empty")
        with self._threads():
            emb = self._embed16k(resample(x, sr, self.sampling_rate))
        return np.asarray(emb, dtype=np.float64).reshape(-1)

    def embed_many(self, signals: Sequence[np.ndarray], sr: int | Sequence[int]) -> np.ndarray:
        """Embeddings of several signals, shape (n, dim), in input order; a bad signal raises
        its AudioError. `sr` is one rate for all or one per signal."""
        out = self.embed_each(signals, sr)
        for r in out:
            if isinstance(r, AudioError):
                raise r
        return np.stack(out) if out else np.zeros((0, self.dim))

    def embed_each(self, signals: Sequence[np.ndarray], sr: int | Sequence[int]) -> list[np.ndarray | AudioError]:
        """Per signal, in input order, its embedding (shape (dim,)) or the AudioError that
        excludes it; one bad signal does not fail the others. `sr`: one rate or one per signal."""
        rates = [int(sr)] * len(signals) if np.ndim(sr) == 0 else [int(r) for r in sr]  # type: ignore[arg-type]
        if len(rates) != len(signals):
            raise ValueError(f"{len(rates)} sample rates for {len(signals)} signals")
        out: list[np.ndarray | AudioError | None] = [None] * len(signals)
        ready: list[int] = []
        clips: list[np.ndarray] = []
        for i, (x, r) in enumerate(zip(signals, rates)):
            x = np.asarray(x, dtype=np.float32)
            if x.ndim != 1 or x.size == 0:
                out[i] = AudioError("speaker embedding needs a non-empty mono signal", code="empty")
                continue
            ready.append(i)
            clips.append(resample(x, r, self.sampling_rate))
        with self._threads():
            embedded = self._embed16k_each(clips)
        for i, e in zip(ready, embedded):
            out[i] = e if isinstance(e, AudioError) else np.asarray(e, dtype=np.float64).reshape(-1)
        return out  # type: ignore[return-value]

    def _embed16k_each(self, xs: list[np.ndarray]) -> list[np.ndarray | AudioError]:
        """Embeddings of mono float32 signals at `sampling_rate` Hz, in order; one at a time
        here (a backend that batches overrides this)."""
        out: list[np.ndarray | AudioError] = []
        for x in xs:
            try:
                out.append(self._embed16k(x))
            except AudioError as exc:
                out.append(exc)
        return out


class ResemblyzerEmbedder(SpeakerEmbedder):
    """GE2E speaker encoder shipped inside the `resemblyzer` package (256-dim)."""

    name, dim = "resemblyzer", 256

    def __init__(self, device: str = "cpu"):
        try:
            from resemblyzer import VoiceEncoder
        except ImportError as exc:
            raise StageFailed(
                "the 'resemblyzer' embedder needs the resemblyzer package "
                "(pip install --no-deps resemblyzer==0.1.4 webrtcvad-wheels librosa)"
            ) from exc
        self.encoder = VoiceEncoder(device, verbose=False)
        self.device = device

    def _identity(self) -> dict[str, Any]:
        import resemblyzer

        weights = Path(resemblyzer.__file__).parent / "pretrained.pt"
        return {"weights_sha256": sha256_file(weights), "device": str(self.device)}

    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        from resemblyzer import preprocess_wav

        # float64 into Resemblyzer's mel filterbank: its matrix product then runs in double
        # precision, whose rounding by instruction set stays far below the float32 the
        # filterbank hands the network (in float32 it differs between AVX-512 and AVX2)
        wav = preprocess_wav(np.asarray(x, dtype=np.float64), source_sr=self.sampling_rate)
        if wav.size < self.sampling_rate // 10:
            raise AudioError(
                "no speech found by the voice activity detector (Resemblyzer preprocessing)", code="no_voicing"
            )
        return self.encoder.embed_utterance(wav)


class EcapaEmbedder(SpeakerEmbedder):
    """SpeechBrain ECAPA-TDNN speaker encoder loaded from a local folder (192-dim).

    One signal (`embed`, or `batch_size` 1) goes through SpeechBrain's
    `encode_batch` alone. Several (`embed_each`, `batch_size` > 1; default 8 on a
    GPU, 1 on the CPU) are sorted by length and run in padded batches, built so
    that every clip gets the embedding it gets alone:

    - filterbanks and the per-utterance mean normalisation are computed per clip
      (as `encode_batch` does for one clip), then padded along time;
    - the network gets each clip's relative length, which the squeeze-excitation
      means and the attentive statistics pooling use as a mask. The lengths are
      set half a frame short of each clip's frame count, so SpeechBrain's
      `length_to_mask(lengths * L)` counts exactly those frames;
    - the TDNN convolutions pad by reflection ('same' padding, mode 'reflect'):
      alone, a clip's last frames see their own mirror image; in a padded batch
      they would see the padding. Before each such convolution the frames just
      past a clip's end are overwritten with that mirror image (a forward
      pre-hook, only during the batched call).

    Passing `wav_lens` to `encode_batch` on a padded batch is not enough: it
    leaves the convolutions' view past the end, and rounds the normalisation's
    frame count. Networks other than SpeechBrain's ECAPA_TDNN, or with other
    convolution padding, are batched only with clips of identical length.
    """

    name, dim = "ecapa", 192

    def __init__(
        self,
        weights: str | Path | None = None,
        device: str | None = None,
        savedir: str | Path | None = None,
        batch_size: int | None = None,
    ):
        source = CHECKPOINTS["ecapa"]
        if weights is None:
            raise ConfigError(
                "the 'ecapa' embedder needs a local weights folder: set "
                "acoustics.speaker_embedding_weights in params.yaml"
            )
        folder = Path(weights).resolve()
        self.folder = folder
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
            source=str(folder),
            savedir=str(savedir),
            overrides={"pretrained_path": str(folder)},
            run_opts={"device": self.device},
        )
        self.model.eval()
        self.batch_size = int(batch_size) if batch_size else (8 if str(self.device).startswith("cuda") else 1)
        self._reflect_pads = _reflect_pads(self.model.mods.embedding_model)
        self._reflect_index: Any = None  # set only while a padded batch runs

    def _identity(self) -> dict[str, Any]:
        files = sorted(p for p in Path(self.folder).iterdir() if p.is_file() and p.suffix in (".ckpt", ".yaml", ".txt"))
        return {
            "weights_sha256": {p.name: sha256_file(p) for p in files},
            "device": str(self.device),
            "batch_size": int(self.batch_size),
        }

    def _embed16k(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            emb = self.model.encode_batch(torch.from_numpy(x)[None])
        return emb.reshape(-1).float().cpu().numpy()

    def _embed16k_each(self, xs: list[np.ndarray]) -> list[np.ndarray | AudioError]:
        if self.batch_size <= 1 or len(xs) <= 1:
            return super()._embed16k_each(xs)
        out: list[Any] = [None] * len(xs)
        if self._reflect_pads is None:  # no exact padding for this network: equal lengths only
            by_len: dict[int, list[int]] = {}
            for i, x in enumerate(xs):
                by_len.setdefault(len(x), []).append(i)
            bs = self.batch_size
            batches = [ids[j : j + bs] for ids in by_len.values() for j in range(0, len(ids), bs)]
        else:
            order = sorted(range(len(xs)), key=lambda i: len(xs[i]))
            batches = [order[j : j + self.batch_size] for j in range(0, len(order), self.batch_size)]
        for ids in batches:
            if len(ids) == 1:
                embs: Any = [self._embed16k(xs[ids[0]])]
            elif self._reflect_pads is None:
                embs = self._encode_equal([xs[i] for i in ids])
            else:
                embs = self._encode_padded([xs[i] for i in ids])
            for i, e in zip(ids, embs):
                out[i] = e
        return out

    def _encode_equal(self, xs: list[np.ndarray]) -> np.ndarray:
        """Embeddings of signals of one length, stacked: nothing is padded."""
        import torch

        with torch.inference_mode():
            emb = self.model.encode_batch(torch.from_numpy(np.stack(xs)))
        return emb.reshape(len(xs), -1).float().cpu().numpy()

    def _encode_padded(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """Embeddings of signals of different lengths in one padded batch (see the class docstring)."""
        import torch

        mods = self.model.mods
        pad = max(self._reflect_pads)
        out: list[Any] = [None] * len(xs)
        with torch.inference_mode():
            feats, keep = [], []
            for i, x in enumerate(xs):
                wav = torch.from_numpy(x)[None].to(self.device).float()
                f = mods.mean_var_norm(mods.compute_features(wav), torch.ones(1, device=self.device))[0]
                if f.shape[0] <= pad:  # too short for the reflection: alone, as SpeechBrain would run it
                    out[i] = self._embed16k(x)
                else:
                    feats.append(f)
                    keep.append(i)
            if keep:
                n = torch.tensor([f.shape[0] for f in feats], device=self.device)
                total = int(n.max()) + pad  # room for the longest clip's mirror image too
                batch = feats[0].new_zeros((len(feats), total, feats[0].shape[1]))
                for j, f in enumerate(feats):
                    batch[j, : f.shape[0]] = f
                t = torch.arange(total, device=self.device)[None]
                self._reflect_index = torch.where(t < n[:, None], t, (2 * n[:, None] - 2 - t).clamp(min=0))[:, None]
                hooks = [
                    m.register_forward_pre_hook(self._reflect_past_end)
                    for m, p in zip(_convolutions(mods.embedding_model), self._reflect_pads)
                    if p > 0
                ]
                try:
                    emb = mods.embedding_model(batch, (n.float() - 0.5) / total)
                finally:
                    for h in hooks:
                        h.remove()
                    self._reflect_index = None
                for i, e in zip(keep, emb.reshape(len(keep), -1).float().cpu().numpy()):
                    out[i] = e
        return out

    def _reflect_past_end(self, module: Any, args: tuple) -> tuple:
        """Forward pre-hook: each clip's frames past its end become its mirror image."""
        x = args[0]
        return (x.gather(2, self._reflect_index.expand(-1, x.shape[1], -1)), *args[1:])


def _convolutions(model: Any) -> list[Any]:
    from speechbrain.nnet.CNN import Conv1d

    return [m for m in model.modules() if isinstance(m, Conv1d)]


def _reflect_pads(model: Any) -> list[int] | None:
    """Per SpeechBrain Conv1d of an ECAPA_TDNN, the frames it pads each side by reflection;
    None where a padded batch cannot reproduce single-clip embeddings (another network,
    another padding, a stride)."""
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    if not isinstance(model, ECAPA_TDNN):
        return None
    pads = []
    for m in _convolutions(model):
        k, d, st = int(m.kernel_size), int(m.dilation), int(m.stride)
        if k == 1:
            pads.append(0)
        elif m.padding == "same" and m.padding_mode == "reflect" and st == 1 and m.skip_transpose and not m.unsqueeze:
            pads.append(d * (k - 1) // 2)
        else:
            return None
    return pads


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


def _embed_paths(part: list[str], embedder: Any, root: Path | None) -> list[tuple[str, Any]]:
    """(path, embedding or the error message that excludes it) for files read from `root`,
    in order: through the embedder's `embed_each` (batched for ECAPA), or its `embed`
    one file at a time for an embedder with only that."""
    from voicebias.audio import read_audio

    out: list[tuple[str, Any]] = []
    read: list[str] = []
    signals, rates = [], []
    for path in part:
        try:
            x, sr = read_audio((Path(root) / path) if root else path)
        except AudioError as exc:
            out.append((path, str(exc)))
            continue
        read.append(path)
        signals.append(x)
        rates.append(sr)
    each = getattr(embedder, "embed_each", None)
    if each is not None:
        results: list[Any] = each(signals, rates)
    else:
        results = []
        for x, sr in zip(signals, rates):
            try:
                results.append(embedder.embed(x, sr))
            except AudioError as exc:
                results.append(exc)
    out.extend((path, str(r) if isinstance(r, AudioError) else r) for path, r in zip(read, results))
    return out


def embed_files(
    paths: Sequence[str],
    embedder: Any,
    root: Path | None = None,
    chunk: int = 64,
    desc: str | None = None,
    cache_dir: Path | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Embeddings of audio files, and the error of each file that has none.

    Files are read `chunk` at a time and handed to the embedder's `embed_each` (batched
    for ECAPA), or to its `embed` one at a time for an embedder with only that. A file
    that cannot be read, or has no usable signal (AudioError), is excluded, not the rest.
    Returns ({path: embedding}, {path: error message}); each path appears once. An
    embedder on the CPU gets the files in parts on forked worker processes, one per
    core (`voicebias.parallel.map_processes`); the results are those of one process.

    With `cache_dir`, embeddings are kept there by content: the sha256 of the file's
    bytes, the embedder's `identity()` (weights, code, device, batch size) and the code paths
    (voicebias.codepaths.identity: the kernels the values were computed with), so the
    same audio is embedded once across stages (the phonation check's stimuli are the
    continuation prompts) and across runs. The float64 values read back are the ones
    computed. Exclusions are not kept: they are found again.
    """
    from tqdm import tqdm

    from voicebias import codepaths
    from voicebias.cache import JsonCache, content_key
    from voicebias.parallel import cores, map_processes

    unique = list(dict.fromkeys(str(p) for p in paths))
    embs: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    keys: dict[str, str] = {}
    cache = JsonCache(Path(cache_dir), shard=2, check=lambda v: isinstance(v, list)) if cache_dir else None
    if cache is not None:
        ident = embedder.identity() if hasattr(embedder, "identity") else {"name": type(embedder).__name__}
        for path in unique:
            full = (Path(root) / path) if root else Path(path)
            if full.is_file():
                keys[path] = content_key(
                    {
                        "entry": "speaker_embedding",
                        "sha256": sha256_file(full),
                        "embedder": ident,
                        "code_paths": codepaths.identity(),
                    }
                )
                hit = cache.get(keys[path])
                if hit is not None:
                    embs[path] = np.asarray(hit, dtype=np.float64)
    # one embedding per distinct audio: a path whose bytes another path holds waits for it
    first_of: dict[str, str] = {}
    twins: dict[str, str] = {}
    for p in unique:
        if p in embs or p not in keys:
            continue
        if keys[p] in first_of:
            twins[p] = first_of[keys[p]]
        else:
            first_of[keys[p]] = p
    todo = [p for p in unique if p not in embs and p not in twins]
    step = max(1, int(chunk))
    workers = min(cores(), -(-len(todo) // 4)) if getattr(embedder, "on_cpu", False) else 1
    if workers > 1:
        # small parts, so that both cores stay busy to the end
        step = max(4, min(step, -(-len(todo) // (4 * workers))))
    parts = [todo[i : i + step] for i in range(0, len(todo), step)]
    run = functools.partial(_embed_paths, embedder=embedder, root=root)
    if workers > 1:
        done = map_processes(run, parts, workers=workers, desc=desc)
    else:
        bar = tqdm(total=len(todo), desc=desc, disable=desc is None or not todo)
        done = []
        for part in parts:
            done.append(run(part))
            bar.update(len(part))
        bar.close()
    for part_result in done:
        for path, r in part_result:
            if isinstance(r, str):
                errors[path] = r
            else:
                embs[path] = r
                if cache is not None and path in keys:
                    cache.put(keys[path], [float(v) for v in np.asarray(r, dtype=np.float64).reshape(-1)])
    for p, q in twins.items():
        if q in embs:
            embs[p] = embs[q]
        else:
            errors[p] = errors[q]
    return embs, errors


def speaker_similarity(
    pairs: pd.DataFrame,
    embedder: SpeakerEmbedder,
    reference_col: str = "reference_path",
    output_col: str = "output_path",
    root: Path | None = None,
    cache_dir: Path | None = None,
) -> pd.DataFrame:
    """Cosine speaker similarity for each (reference, output) pair of audio files.

    Returns the pairs table with `speaker_similarity` (cosine), `status` ('ok' or
    'excluded') and `error`; a bad file excludes its pair, not the batch. Every file is
    embedded once (`embed_files`: in batches where the embedder batches, through the
    embedding cache under `cache_dir` when given).
    """
    refs = [str(p) for p in pairs[reference_col]]
    outs = [str(p) for p in pairs[output_col]]
    embs, file_errors = embed_files([p for ab in zip(refs, outs) for p in ab], embedder, root, cache_dir=cache_dir)
    sims, status, errors = [], [], []
    for a, b in zip(refs, outs):
        bad = next((file_errors[p] for p in (a, b) if p in file_errors), None)
        if bad is None:
            sims.append(cosine_similarity(embs[a], embs[b]))
            status.append("ok")
            errors.append("")
        else:
            sims.append(np.nan)
            status.append("excluded")
            errors.append(bad)
    return pairs.assign(speaker_similarity=sims, status=status, error=errors)


def embedder_from_params(acoustics: dict[str, Any], root: Path | None = None) -> SpeakerEmbedder:
    """The speaker embedder named by `acoustics.speaker_embedding` (weights folder from
    `acoustics.speaker_embedding_weights`, relative to the project root; ECAPA's batch size
    from `acoustics.speaker_embedding_batch_size`, default 8 on a GPU, 1 on the CPU)."""
    name = acoustics["speaker_embedding"]
    weights = acoustics.get("speaker_embedding_weights")
    if name == "ecapa":
        w = Path(weights) if weights else None
        return get_embedder(
            name,
            weights=(Path(root) / w if root and w and not w.is_absolute() else w),
            batch_size=acoustics.get("speaker_embedding_batch_size"),
        )
    return get_embedder(name)
