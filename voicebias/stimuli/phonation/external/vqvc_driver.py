"""Batch driver for VoiceQualityVC, run INSIDE the user's VQVC environment and checkout.

    <vqvc-python> vqvc_driver.py jobs.json        (working directory: the checkout)

Standard library, numpy, soundfile and torch only; voicebias is not importable there. It imports
the checkout's own modules from `repo` and calls them; the models load once, then every item is
converted in turn, and after each item the statuses so far are written to `status_path` as JSON
(a failed item is recorded and the batch goes on). Exit code 0 when the batch ran, 2 when the
models could not be loaded.

The jobs.json and status formats: docs/phonation.md, "The driver".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from typing import Any

import numpy as np

#: voicebias feature name -> the keyword VQVC's SynthesizerTrn.infer takes it by.
INFER_KEYWORDS = {
    "creak": "creaks",
    "cpps": "cpps",
    "h1_h2": "h1h2s",
    "pitch": "pitches",
    "h1_a3": "h1a3s",
    "pitch_var": "pitch_vars",
}
#: The config switches (model section) that must be on for each feature's encoder.
CONFIG_SWITCHES = {
    "creak": "creak",
    "cpps": "cpps",
    "h1_h2": "h1h2",
    "pitch": "pitch",
    "h1_a3": "h1a3",
    "pitch_var": "pitch_var",
}


def fit_frames(cond: np.ndarray, frames: int) -> np.ndarray:
    """`cond` (rows, k) resampled to `frames` rows by linear interpolation over relative time.

    Unchanged when the counts agree; the first and last rows map onto the first and
    last frames, so constant tracks stay exact and a ramp keeps its endpoints.
    """
    cond = np.asarray(cond, dtype=np.float32)
    rows = cond.shape[0]
    if rows == frames:
        return cond
    if rows == 1:
        return np.repeat(cond, frames, axis=0)
    src = np.linspace(0.0, 1.0, rows)
    dst = np.linspace(0.0, 1.0, frames)
    return np.stack([np.interp(dst, src, cond[:, j]) for j in range(cond.shape[1])], axis=1).astype(np.float32)


def trim_silence(x: np.ndarray, top_db: float = 20.0, frame: int = 512, hop: int = 128) -> np.ndarray:
    """`x` without leading and trailing stretches quieter than top_db below its loudest frame."""
    if len(x) < frame:
        return x
    n = 1 + (len(x) - frame) // hop
    rms = np.array([np.sqrt(np.mean(np.square(x[i * hop : i * hop + frame], dtype=np.float64))) for i in range(n)])
    if not np.any(rms > 0):
        return x
    loud = np.flatnonzero(20 * np.log10(np.maximum(rms, 1e-12) / rms.max()) > -top_db)
    return x[loud[0] * hop : min(len(x), loud[-1] * hop + frame)]


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.part"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


def _read_mono(path: str, rate: int) -> np.ndarray:
    import soundfile as sf

    x, sr = sf.read(path, dtype="float32", always_2d=True)
    if sr != rate:
        raise ValueError(f"{path}: sample rate {sr} Hz, VQVC needs {rate} Hz")
    x = x.mean(axis=1)
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"{path}: empty or non-finite audio")
    return x


def load(job: dict[str, Any]) -> dict[str, Any]:
    """Import the checkout's modules and load generator, WavLM and speaker encoder once."""
    repo = job["repo"]
    if repo not in sys.path:
        sys.path.insert(0, repo)
    import importlib.util

    import torch

    if importlib.util.find_spec("hifigan") is None:
        # utils.py imports hifigan for a vocoder VQVC does not use at inference; the
        # VQVC repository does not ship it, so an empty stand-in satisfies the import.
        sys.modules["hifigan"] = types.ModuleType("hifigan")
    import logging

    import utils  # noqa: E402  (the checkout's)
    from speaker_encoder.voice_encoder import SpeakerEncoder
    from wavlm import WavLM, WavLMConfig

    from models import SynthesizerTrn

    logging.getLogger().setLevel(logging.WARNING)  # the checkout's utils logs at DEBUG to stdout
    device = job.get("device") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)

    if sorted(job["features"]) != sorted(INFER_KEYWORDS):
        raise ValueError(f"features {job['features']} do not match the driver's {sorted(INFER_KEYWORDS)}")
    hps = utils.get_hparams_from_file(job["config"])
    off = [f for f, key in CONFIG_SWITCHES.items() if not getattr(hps.model, key, False)]
    if off:
        raise ValueError(f"config {job['config']} switches off the encoder(s) for {off}")
    rate = int(hps.data.sampling_rate)
    if rate != int(job["sample_rate"]) or abs(hps.data.hop_length / rate - float(job["frame_s"])) > 1e-9:
        raise ValueError(
            f"config {job['config']}: {rate} Hz with hop {hps.data.hop_length}; the conditioning "
            f"assumes {job['sample_rate']} Hz and {job['frame_s']} s frames"
        )
    net = SynthesizerTrn(hps.data.filter_length // 2 + 1, hps.train.segment_size // hps.data.hop_length, **hps.model)
    utils.load_checkpoint(job["checkpoint"], net, None, True)
    net = net.to(device).eval()

    ckpt = torch.load(job["wavlm"], map_location="cpu")
    wavlm = WavLM(WavLMConfig(ckpt["cfg"]))
    wavlm.load_state_dict(ckpt["model"])
    wavlm = wavlm.to(device).eval()

    speaker = SpeakerEncoder(job["speaker_encoder"], device=device)
    return {
        "torch": torch,
        "utils": utils,
        "net": net,
        "wavlm": wavlm,
        "speaker": speaker,
        "device": device,
        "rate": rate,
        "features": list(job["features"]),
    }


def convert(state: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """Convert one item; raise on any problem with it."""
    import soundfile as sf

    torch, device, rate = state["torch"], state["device"], state["rate"]
    x = _read_mono(item["input"], rate)
    ref = x if item.get("speaker") in (None, "", item["input"]) else _read_mono(item["speaker"], rate)
    cond = np.load(item["conditioning"])
    if cond.ndim != 2 or cond.shape[1] != len(state["features"]) or not np.all(np.isfinite(cond)):
        raise ValueError(
            f"{item['conditioning']}: expected a finite (frames, {len(state['features'])}) array, "
            f"got shape {cond.shape}"
        )
    torch.manual_seed(int(item.get("seed", 0)))
    with torch.no_grad():
        g = torch.from_numpy(np.asarray(state["speaker"].embed_utterance(trim_silence(ref)), dtype=np.float32))
        g = g.unsqueeze(0).to(device)
        c = state["utils"].get_content(state["wavlm"], torch.from_numpy(x).unsqueeze(0).to(device))
        frames = int(c.shape[-1])
        fitted = fit_frames(cond, frames)
        tracks = {
            INFER_KEYWORDS[name]: torch.from_numpy(np.ascontiguousarray(fitted[:, j])).view(1, 1, frames).to(device)
            for j, name in enumerate(state["features"])
        }
        audio = state["net"].infer(c, g=g, **tracks)
    y = audio[0][0].detach().float().cpu().numpy().reshape(-1)
    if y.size == 0 or not np.all(np.isfinite(y)):
        raise ValueError("VQVC returned empty or non-finite audio")
    out = item["output"]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fmt = {".flac": "FLAC", ".ogg": "OGG"}.get(os.path.splitext(out)[1].lower(), "WAV")
    tmp = f"{out}.part"
    sf.write(tmp, np.clip(y, -1.0, 1.0), rate, subtype="PCM_16", format=fmt)
    os.replace(tmp, out)
    return {
        "output": out,
        "frames_conditioning": int(cond.shape[0]),
        "frames_model": frames,
        "duration_s": round(y.size / rate, 4),
        "peak": float(np.max(np.abs(y))),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vqvc_driver.py jobs.json", file=sys.stderr)
        return 64
    with open(argv[1]) as fh:
        job = json.load(fh)
    try:
        state = load(job)
    except Exception:
        traceback.print_exc()
        print("VQVC driver: loading the models failed", file=sys.stderr)
        return 2
    statuses: list[dict[str, Any]] = []
    for item in job["items"]:
        t0 = time.monotonic()
        try:
            info = convert(state, item)
            status = {"index": item["index"], "status": "ok", **info}
        except Exception as exc:  # one bad item is recorded, the batch goes on
            traceback.print_exc()
            status = {"index": item["index"], "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        status["seconds"] = round(time.monotonic() - t0, 3)
        statuses.append(status)
        _write_json(job["status_path"], statuses)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
