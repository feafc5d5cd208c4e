"""VAE-GSLM driver (b04901014/vae-gslm): continue an audio prompt through the repository's two scripts.

The repository has no inference API, only scripts run over a dataset, so each request runs them on
a one-file dataset, as its README's "Running Inference" section does: scripts.hubert_kmeans writes
the prompt's semantic tokens, then scripts.infer re-synthesises the prompt and continues it; the
prompt's seconds are cut off, so the reply is the continuation alone (16 kHz). Each request loads
the models anew.

The commands, the config and the weights folder: docs/repository-systems.md, "VAE-GSLM".
"""

import os
import shutil
import subprocess
import sys
import tempfile

from _protocol import revision, serve, write_wav

CONFIG = os.path.join("configs", "infer", "speech", "vae-gslm.yaml")
NEEDED = ("vae-gslm_ckpt", "vocoder_ckpt", "kmeans_v200.npy", "hubert-large-ll60k")
RATE = 16000


def _read_wav(path):
    import soundfile as sf

    x, sr = sf.read(path, dtype="float32", always_2d=True)
    return x.mean(axis=1), sr


def load(config):
    checkout, root, s = config["checkout"], config["weights"], config["settings"]
    for rel in ("scripts/hubert_kmeans.py", "scripts/infer.py", CONFIG):
        if not os.path.isfile(os.path.join(checkout, rel)):
            raise FileNotFoundError(f"{checkout} is not a vae-gslm checkout: it has no {rel}")
    missing = [n for n in NEEDED if not os.path.exists(os.path.join(root, n))]
    if missing:
        raise FileNotFoundError(f"{root} lacks {', '.join(missing)} (see docs/repository-systems.md)")
    import yaml

    with open(os.path.join(checkout, CONFIG), encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    if s.get("temperature") is not None:  # the system's temperature sets both of the config's
        base["temperature"] = base["token_temperature"] = float(s["temperature"])
    settings = {"temperature": base.get("temperature"), "token_temperature": base.get("token_temperature")}
    return (checkout, root, base), {"revision": revision(os.path.join(root, "vae-gslm_ckpt")), "sampling": settings}


def _run(argv, cwd):
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"`{' '.join(argv[1:4])}` failed (exit code {res.returncode}): {tail}")


def handle(state, req):
    import yaml

    checkout, root, base = state
    work = tempfile.mkdtemp(prefix="vae-gslm-")
    try:
        x, sr = _read_wav(req["audio"])
        if sr != RATE:
            raise ValueError(f"the prompt is {sr} Hz; VAE-GSLM's scripts take {RATE} Hz")
        write_wav(os.path.join(work, "prompt.wav"), x, RATE)
        with open(os.path.join(work, "metadata.txt"), "w", encoding="utf-8") as fh:
            fh.write("prompt.wav\n")
        _run(
            [
                sys.executable,
                "-m",
                "scripts.hubert_kmeans",
                "-c",
                os.path.join(root, "kmeans_v200.npy"),
                "-m",
                os.path.join(root, "hubert-large-ll60k"),
                "-i",
                os.path.join(work, "metadata.txt"),
                "-w",
                work,
                "-o",
                os.path.join(work, "tokens.txt"),
            ],
            checkout,
        )
        prompt_s = len(x) / RATE
        cont_s = float(req.get("continuation_s") or 6.0)
        hp = dict(base)
        hp.update(
            output_dir=os.path.join(work, "samples"),
            sample_prior_length=prompt_s,
            sample_length=cont_s,
            ckpt_path=os.path.join(root, "vae-gslm_ckpt"),
        )
        hp["vocoder"] = {**(base.get("vocoder") or {}), "path": os.path.join(root, "vocoder_ckpt")}
        hp["data"] = {
            **(base.get("data") or {}),
            "path": os.path.join(work, "tokens.txt"),
            "wavdir": work,
            "min_audio_length": 0.0,
            "batch_size": 1,
            "num_workers": 0,
        }
        with open(os.path.join(work, "infer.yaml"), "w", encoding="utf-8") as fh:
            yaml.safe_dump(hp, fh)
        _run([sys.executable, "-m", "scripts.infer", "-c", os.path.join(work, "infer.yaml")], checkout)
        y, ysr = _read_wav(os.path.join(work, "samples", "1.wav"))
        cont = y[int(round(prompt_s * ysr)) :]
        if cont.size == 0:
            raise RuntimeError("the model's sample holds no audio after the prompt")
        write_wav(req["out"], cont, ysr)
        return {"text": None}
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    serve(load, handle)
