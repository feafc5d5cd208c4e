"""VoiceQualityVC adapter: phonation conversion by the user's own VQVC checkout.

VoiceQualityVC (github.com/Hfkml/VQVC) is a FreeVC-style voice converter conditioned on six
voice-quality tracks per 20 ms content frame. Nothing of it is copied or imported here: the user
clones it and builds its environment, and this module runs a small driver
(:mod:`voicebias.stimuli.phonation.external.vqvc_driver`) with that environment's interpreter, in
the checkout, over a JSON list of jobs, so the models load once per batch. A preset is used as an
absolute target in VQVC's SD units (0 = the speaker's average), on top of a per-feature baseline
(``phonation.vqvc.baseline``), not as an offset from the source's own measures.

How VQVC is driven, the conditioning, frames and params: docs/phonation.md, "VoiceQualityVC".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import soundfile as sf

from voicebias.audio import AudioError, read_audio
from voicebias.contract import CONDITIONS
from voicebias.errors import ConfigError, SetupError, VoicebiasError
from voicebias.io import resolve_path
from voicebias.secrets import child_env
from voicebias.stimuli.phonation.presets import (
    FEATURES,
    FRAME_S,
    PAPER_PRESETS,
    conditioning,
    n_frames,
    presets_from_params,
)

REPO_URL = "https://github.com/Hfkml/VQVC"
SAMPLE_RATE = 16000
DRIVER = Path(__file__).resolve().parent / "external" / "vqvc_driver.py"
#: The marker that tells a VQVC checkout from FreeVC or CreakVC: the generator's
#: inference takes the voice-quality tracks by these keyword names.
MARKERS = ("h1a3s", "pitch_vars")
#: The switches in the config's model section that turn the six encoders on.
CONFIG_SWITCHES = ("creak", "cpps", "h1h2", "pitch", "h1a3", "pitch_var")

#: The authors' notebook (VQVC.ipynb) sets the pitch track to -1.5 SD in every
#: conversion and leaves the other tracks at 0.
DEFAULT_BASELINE: dict[str, float] = {"pitch": -1.5}

DEFAULTS: dict[str, Any] = {
    "repo": "external/VQVC",
    "python": None,
    "checkpoint": "models/vqvc/G_VQVC.pth",
    "wavlm": "models/vqvc/WavLM-Large.pt",
    "speaker_encoder": "models/vqvc/pretrained_bak_5805000.pt",
    "config": "configs/freevc.json",
    "device": "auto",
    "seed": 0,
    "load_timeout_s": 900.0,
    "item_timeout_s": 120.0,
}


class VQVCError(VoicebiasError, RuntimeError):
    """The VQVC driver failed as a whole (crashed, could not load, timed out)."""


@dataclass(frozen=True)
class VQVCConfig:
    """Where the user's VQVC checkout, environment and checkpoints are, and how to run it.

    repo             the user's clone of Hfkml/VQVC
    python           the interpreter of VQVC's own environment
    checkpoint       the VQVC generator checkpoint (G_VQVC.pth from the repository's release)
    wavlm            WavLM-Large.pt (content encoder weights)
    speaker_encoder  the FreeVC speaker-encoder checkpoint (pretrained_bak_5805000.pt)
    config           the FreeVC-style JSON config (relative to the checkout unless absolute)
    device           'auto' (CUDA when the VQVC environment sees one), 'cpu', 'cuda', 'cuda:N'
    baseline         absolute SD-unit values added to every preset, per feature (default
                     DEFAULT_BASELINE: pitch -1.5, the rest 0)
    seed             torch seed per item unless a job gives its own
    load_timeout_s   seconds allowed for loading the models, plus
    item_timeout_s   seconds per item, make the batch's time limit
    """

    repo: Path
    python: str | None
    checkpoint: Path
    wavlm: Path
    speaker_encoder: Path
    config: Path
    device: str = "auto"
    baseline: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BASELINE))
    seed: int = 0
    load_timeout_s: float = 900.0
    item_timeout_s: float = 120.0
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: presets_from_params(None))
    root: Path | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None, root: Path | None = None) -> "VQVCConfig":
        """From the `phonation` section (its `vqvc` and `presets` keys); the whole params also works."""
        params = dict(params or {})
        if "phonation" in params:
            params = dict(params["phonation"] or {})
        if root is None:
            from voicebias.config import ROOT

            root = ROOT
        root = Path(root)
        section = dict(params.get("vqvc") or {})
        unknown = sorted(set(section) - set(DEFAULTS) - {"baseline"})
        if unknown:
            raise ConfigError(
                f"phonation.vqvc: unknown key(s) {unknown}; expected some of {sorted([*DEFAULTS, 'baseline'])}"
            )
        s = {**DEFAULTS, **{k: v for k, v in section.items() if v is not None}}
        baseline = {**DEFAULT_BASELINE, **dict(section.get("baseline") or {})}
        bad = sorted(set(baseline) - set(FEATURES))
        if bad:
            raise ConfigError(f"phonation.vqvc.baseline: unknown feature(s) {bad}; expected some of {list(FEATURES)}")
        for k, v in baseline.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ConfigError(f"phonation.vqvc.baseline.{k} must be a finite number of SD units, not {v!r}")
        repo = resolve_path(s["repo"], root)
        python = s["python"]
        if python is not None:
            python = str(python)
            if os.sep in python or python.startswith("."):
                python = str(resolve_path(python, root))
        config = Path(s["config"]).expanduser()
        return cls(
            repo=repo,
            python=python,
            checkpoint=resolve_path(s["checkpoint"], root),
            wavlm=resolve_path(s["wavlm"], root),
            speaker_encoder=resolve_path(s["speaker_encoder"], root),
            config=config if config.is_absolute() else repo / config,
            device=str(s["device"]),
            baseline={k: float(v) for k, v in baseline.items()},
            seed=int(s["seed"]),
            load_timeout_s=float(s["load_timeout_s"]),
            item_timeout_s=float(s["item_timeout_s"]),
            presets=presets_from_params(params),
            root=root,
        )


# ---------------------------------------------------------------------------
# setup checks


def _show(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            pass
    return str(path)


def _weights_advice(path: Path, root: Path | None, what: str, where: str) -> str:
    shown = _show(path, root)
    if Path(f"{path}.dvc").exists():
        return f"{what} is tracked by DVC at {shown} but not in the workspace: run `dvc pull {shown}.dvc`"
    return (
        f"{what} not found at {shown}. {where} Put it at {shown} (or set the path in params.yaml) "
        f"and track it with DVC: `dvc add {shown}`, then commit {shown}.dvc."
    )


def _python_exists(python: str) -> bool:
    return Path(python).is_file() or (os.sep not in python and shutil.which(python) is not None)


def _checks(cfg: VQVCConfig) -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each piece VQVC needs; details say how to fix what is missing."""
    root, repo = cfg.root, cfg.repo
    shown = _show(repo, root)
    out: list[tuple[str, bool, str]] = []
    if not repo.is_dir():
        out.append(
            (
                "checkout",
                False,
                f"VQVC checkout not found at {shown}. Clone it there: `git clone {REPO_URL} {shown}` "
                "(or set phonation.vqvc.repo to your clone).",
            )
        )
    else:
        models = repo / "models.py"
        text = models.read_text(errors="replace") if models.is_file() else ""
        if all(m in text for m in MARKERS):
            out.append(("checkout", True, f"VQVC checkout at {shown}"))
        else:
            why = (
                "has no models.py"
                if not models.is_file()
                else "has a models.py without the voice-quality inputs (h1a3s, pitch_vars) of VQVC's generator"
            )
            out.append(
                (
                    "checkout",
                    False,
                    f"{shown} is not a VQVC checkout: it {why}. It may be FreeVC or CreakVC; clone "
                    f"{REPO_URL} instead and set phonation.vqvc.repo to it.",
                )
            )
        if (repo / "wavlm" / "__init__.py").is_file() or (repo / "wavlm.py").is_file():
            out.append(("wavlm code", True, f"WavLM code in {shown}/wavlm"))
        else:
            out.append(
                (
                    "wavlm code",
                    False,
                    f"the checkout lacks the WavLM code ({shown}/wavlm/ is not in the VQVC repository): copy "
                    "the wavlm folder of microsoft/unilm (WavLM.py, modules.py) into it, with an __init__.py "
                    "that exports WavLM and WavLMConfig (FreeVC's wavlm/ folder is exactly this).",
                )
            )
        conf = cfg.config
        if not conf.is_file():
            out.append(
                (
                    "config",
                    False,
                    f"VQVC config not found at {_show(conf, root)}; set phonation.vqvc.config to the JSON config "
                    "the checkpoint was trained with (configs/freevc.json in VQVC).",
                )
            )
        else:
            try:
                model = json.loads(conf.read_text()).get("model") or {}
                off = [k for k in CONFIG_SWITCHES if not model.get(k)]
                ok = not off
                detail = (
                    f"config {_show(conf, root)}"
                    if ok
                    else f"config {_show(conf, root)} switches off the {', '.join(off)} encoder(s); VQVC needs "
                    f"all six ({', '.join(CONFIG_SWITCHES)}) set to true in its model section"
                )
            except (ValueError, AttributeError) as exc:
                ok, detail = False, f"config {_show(conf, root)} is not valid JSON ({exc})"
            out.append(("config", ok, detail))
    if cfg.python is None:
        out.append(
            (
                "python",
                False,
                f"phonation.vqvc.python is not set. Create VQVC's own environment (its pins need Python 3.10 "
                f"or older, e.g. `python3.10 -m venv {shown}/.venv && {shown}/.venv/bin/pip install -r "
                f"{shown}/requirements.txt`) and set phonation.vqvc.python to its interpreter.",
            )
        )
    elif not _python_exists(cfg.python):
        out.append(
            (
                "python",
                False,
                f"the VQVC interpreter {_show(Path(cfg.python), root)} does not exist. Create VQVC's "
                f"environment (Python 3.10 or older: `python3.10 -m venv {shown}/.venv && "
                f"{shown}/.venv/bin/pip install -r {shown}/requirements.txt`) or point phonation.vqvc.python "
                "at the interpreter of the one you have.",
            )
        )
    else:
        out.append(("python", True, f"VQVC interpreter {_show(Path(cfg.python), root)}"))
    for what, path, where in (
        ("VQVC generator checkpoint", cfg.checkpoint, f"Download G_VQVC.pth from the release of {REPO_URL}."),
        ("WavLM-Large checkpoint", cfg.wavlm, "Download WavLM-Large.pt from the WavLM page of microsoft/unilm."),
        (
            "speaker-encoder checkpoint",
            cfg.speaker_encoder,
            "It is FreeVC's speaker_encoder/ckpt/pretrained_bak_5805000.pt (github.com/OlaWod/FreeVC).",
        ),
    ):
        if Path(path).is_file():
            out.append((what, True, f"{what} at {_show(path, root)}"))
        else:
            out.append((what, False, _weights_advice(Path(path), root, what, where)))
    return out


def check_setup(cfg: VQVCConfig) -> None:
    """Raise SetupError naming every missing piece and how to set it up."""
    problems = [detail for _, ok, detail in _checks(cfg) if not ok]
    if problems:
        raise SetupError("VoiceQualityVC (phonation conversion) is not set up:\n- " + "\n- ".join(problems))


def setup_report(cfg: VQVCConfig) -> list[str]:
    """One line per piece, 'ok: ...' or 'missing: ...', for the preflight to print."""
    lines = [f"{'ok' if ok else 'missing'}: {detail}" for _, ok, detail in _checks(cfg)]
    for path in (cfg.checkpoint, cfg.wavlm, cfg.speaker_encoder):
        if Path(path).is_file() and not Path(f"{path}.dvc").exists():
            shown = _show(Path(path), cfg.root)
            lines.append(
                f"note: {shown} is not tracked by DVC (no {shown}.dvc); run `dvc add {shown}` "
                "so the run records which weights it used"
            )
    if cfg.repo.is_dir() and not (cfg.repo / "hifigan").exists():
        lines.append(
            "note: the checkout has no hifigan/ (its utils.py imports it); the driver supplies an empty "
            "stand-in, which is fine since VQVC does not use that vocoder at inference"
        )
    return lines


# ---------------------------------------------------------------------------
# conditioning


def build_conditioning(
    condition: str,
    duration_s: float,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
    baseline: Mapping[str, float] | None = None,
) -> np.ndarray:
    """(n_frames(duration_s), 6) float32 VQVC tracks for `condition`, columns in FEATURES order.

    The preset's offsets (SD units) plus the per-feature `baseline` (absolute SD units,
    0 = the speaker's average; see the module docstring).
    """
    presets = PAPER_PRESETS if presets is None else presets
    if condition not in presets:
        raise ValueError(f"unknown phonation condition '{condition}'; expected one of {list(CONDITIONS)}")
    out = conditioning(presets[condition], n_frames(duration_s, FRAME_S), name=condition)
    for k, v in (baseline or {}).items():
        if k not in FEATURES:
            raise ValueError(f"baseline: unknown feature '{k}'; expected some of {list(FEATURES)}")
        out[:, FEATURES.index(k)] += float(v)
    return out.astype(np.float32)


# ---------------------------------------------------------------------------
# batch conversion


def _tail(text: str | bytes | None, n: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-n:])


def _child_env(cfg: VQVCConfig) -> dict[str, str]:
    """The allow-listed environment (voicebias.secrets.child_env) with the checkout on PYTHONPATH."""
    return child_env(
        {
            "PYTHONPATH": os.pathsep.join([str(cfg.repo), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1",
        }
    )


def _prepare(src: str | os.PathLike[str], dest: Path) -> float:
    """A 16 kHz mono float copy of `src` at `dest`; returns its duration in s."""
    x, _ = read_audio(src, target_sr=SAMPLE_RATE)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(dest), x, SAMPLE_RATE, subtype="FLOAT", format="WAV")
    return len(x) / SAMPLE_RATE


def convert_batch(
    cfg: VQVCConfig, jobs: Sequence[Mapping[str, Any]], workdir: str | os.PathLike[str]
) -> list[dict[str, Any]]:
    """Convert each job's recording to its phonation condition with VQVC, one process for all.

    A job: {"input": path, "output": path, "condition": one of CONDITIONS, optionally
    "id", "speaker" (another recording of the same voice for the speaker embedding;
    default the input itself) and "seed"}. Inputs are read and resampled to 16 kHz
    mono here; the conditioning of each is written to `workdir` as .npy.

    Returns one dict per job, in order: id, input, output, condition, status ('ok' or
    'failed'), error, conditioning (.npy path), frames_conditioning, frames_model,
    duration_s. One unreadable or failing item is recorded and the others go on; a
    driver that fails as a whole (cannot load, crashes, times out) raises VQVCError
    with the tail of its stderr.
    """
    check_setup(cfg)
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    speakers: dict[str, str] = {}
    for i, job in enumerate(jobs):
        jid = str(job.get("id", i))
        res: dict[str, Any] = {
            "id": jid,
            "input": str(job["input"]),
            "output": str(job["output"]),
            "condition": str(job["condition"]),
            "status": "failed",
            "error": "",
            "conditioning": None,
            "frames_conditioning": None,
            "frames_model": None,
            "duration_s": None,
        }
        results.append(res)
        if res["condition"] not in cfg.presets:
            res["error"] = f"unknown phonation condition '{res['condition']}'; expected one of {list(CONDITIONS)}"
            continue
        try:
            wav = work / "inputs" / f"{i:05d}.wav"
            duration = _prepare(job["input"], wav)
            speaker = str(wav)
            if job.get("speaker"):
                key = str(job["speaker"])
                if key not in speakers:
                    dest = work / "speakers" / f"{len(speakers):05d}.wav"
                    _prepare(key, dest)
                    speakers[key] = str(dest)
                speaker = speakers[key]
        except (AudioError, OSError, RuntimeError) as exc:
            res["error"] = f"cannot read input: {exc}"
            continue
        cond = build_conditioning(res["condition"], duration, cfg.presets, cfg.baseline)
        npy = work / "conditioning" / f"{i:05d}_{res['condition']}.npy"
        npy.parent.mkdir(parents=True, exist_ok=True)
        np.save(npy, cond)
        res.update(conditioning=str(npy), frames_conditioning=int(cond.shape[0]))
        items.append(
            {
                "index": i,
                "input": str(wav),
                "speaker": speaker,
                "conditioning": str(npy),
                "output": str(Path(job["output"]).resolve()),
                "seed": int(job.get("seed", cfg.seed)),
            }
        )
    if not items:
        return results

    status_path = work / "status.json"
    if status_path.exists():
        status_path.unlink()
    spec = {
        "repo": str(cfg.repo),
        "config": str(cfg.config),
        "checkpoint": str(cfg.checkpoint),
        "wavlm": str(cfg.wavlm),
        "speaker_encoder": str(cfg.speaker_encoder),
        "device": cfg.device,
        "sample_rate": SAMPLE_RATE,
        "frame_s": FRAME_S,
        "features": list(FEATURES),
        "status_path": str(status_path),
        "items": items,
    }
    job_json = work / "jobs.json"
    job_json.write_text(json.dumps(spec, indent=1))
    timeout = cfg.load_timeout_s + cfg.item_timeout_s * len(items)
    try:
        proc = subprocess.run(
            [str(cfg.python), str(DRIVER), str(job_json)],
            cwd=cfg.repo,
            env=_child_env(cfg),
            timeout=timeout,
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired as exc:
        raise VQVCError(
            f"the VQVC driver did not finish {len(items)} item(s) within {timeout:g} s "
            f"(phonation.vqvc.load_timeout_s + item_timeout_s per item); last stderr lines:\n"
            f"{_tail(exc.stderr)}"
        ) from None
    except OSError as exc:
        raise SetupError(f"cannot start the VQVC interpreter {cfg.python}: {exc}") from None
    statuses = json.loads(status_path.read_text()) if status_path.exists() else []
    if proc.returncode != 0:
        raise VQVCError(
            f"the VQVC driver failed (exit code {proc.returncode}) after {len(statuses)} of "
            f"{len(items)} item(s); last stderr lines:\n{_tail(proc.stderr)}"
        )
    by_index = {int(s["index"]): s for s in statuses}
    for item in items:
        res = results[item["index"]]
        st = by_index.get(item["index"])
        if st is None:
            res["error"] = "the VQVC driver reported nothing for this item"
            continue
        res.update(
            status=st.get("status", "failed"),
            error=st.get("error", ""),
            frames_model=st.get("frames_model"),
            duration_s=st.get("duration_s"),
        )
    return results
