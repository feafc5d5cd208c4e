"""A stand-in repository driver, and a bare environment to run it in, for the tests of `voicebias serve`,
the shim and the repository adapter's served route.

The driver speaks the driver line protocol (voicebias/systems/drivers/_protocol.py) with the
standard library alone, so it runs where voicebias is not installed: it answers with the input
audio reversed and a transcript naming the hash of the input samples, the seed, the prompt and,
when the request carries one, continuation_s. A prompt holding FAIL is refused with an error for
that input; a prompt holding NOAUDIO gets an empty output file. It is written by the tests,
never shipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STAND_IN_DRIVER = r"""
import array, hashlib, importlib.util, json, os, sys, wave

config = json.loads(sys.argv[1])
info = {"revision": "stand-in-1", "environment": os.path.basename(sys.prefix),
        "voicebias_importable": importlib.util.find_spec("voicebias") is not None,
        "checkout": os.path.basename(config["checkout"])}
print(json.dumps({"ready": True, "info": info}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "FAIL" in req["prompt"]:
        print(json.dumps({"id": req["id"], "status": "failed", "error": "the stand-in refuses this input"}),
              flush=True)
        continue
    if "NOAUDIO" in req["prompt"]:
        open(req["out"], "wb").close()
        print(json.dumps({"id": req["id"], "status": "ok", "text": "nothing to say"}), flush=True)
        continue
    with wave.open(req["audio"], "rb") as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    samples = array.array("h", frames)
    samples.reverse()
    with wave.open(req["out"], "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate); w.writeframes(samples.tobytes())
    text = f"input {hashlib.sha256(frames).hexdigest()[:16]} seed {req['seed']} prompt {req['prompt']}"
    if "continuation_s" in req:
        text += f" continuation_s {req['continuation_s']}"
    print(json.dumps({"id": req["id"], "status": "ok", "text": text}), flush=True)
"""


def stand_in_driver(folder: Path) -> Path:
    """Write the stand-in driver into `folder`; its path."""
    path = Path(folder) / "stand_in_driver.py"
    path.write_text(STAND_IN_DRIVER)
    return path


def bare_python(folder: Path) -> str:
    """The interpreter of a new virtual environment under `folder` holding the standard library alone."""
    env_dir = Path(folder) / "system-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=60)
    return str(env_dir / "bin" / "python")
