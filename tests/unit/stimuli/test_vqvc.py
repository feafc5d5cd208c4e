"""VoiceQualityVC adapter: conditioning arrays, setup checks, and the batch driver run
for real in a subprocess against a fake checkout (same import surface as VQVC, tiny
behaviour: the "converter" returns its input at half gain and records what it got)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voicebias.errors import SetupError
from voicebias.stimuli.phonation.external.vqvc_driver import fit_frames, trim_silence
from voicebias.stimuli.phonation.presets import FEATURES, PAPER_PRESETS, n_frames
from voicebias.stimuli.phonation.vqvc import (
    VQVCConfig,
    VQVCError,
    build_conditioning,
    check_setup,
    convert_batch,
    setup_report,
)

SR = 16000

# ---------------------------------------------------------------------------
# conditioning


def row(**values: float) -> list[float]:
    return [values.get(f, 0.0) for f in FEATURES]


def test_features_order_is_vqvc_order():
    assert FEATURES == ("creak", "cpps", "h1_h2", "pitch", "h1_a3", "pitch_var")


@pytest.mark.parametrize(
    "condition,expected",
    [
        ("breathy", row(creak=-2, cpps=-1, h1_h2=3, h1_a3=3)),
        ("creaky", row(creak=2, cpps=-1.5, h1_h2=-2, h1_a3=-2)),
        ("modal", row()),
    ],
)
def test_constant_presets_give_the_paper_values_on_every_frame(condition, expected):
    c = build_conditioning(condition, 0.5, PAPER_PRESETS)
    assert c.dtype == np.float32 and c.shape == (25, 6)
    np.testing.assert_array_equal(c, np.tile(np.array(expected, dtype=np.float32), (25, 1)))


def test_endcreak_is_zero_before_the_midpoint_then_ramps_to_the_targets():
    # 0.12 s -> 6 frames; midpoint frame 3; ramp weights 0, 0.5, 1 on frames 3, 4, 5
    c = build_conditioning("endcreak", 0.12, PAPER_PRESETS)
    expected = np.array(
        [
            row(),
            row(),
            row(),
            row(),
            row(creak=3.5, cpps=-1, h1_h2=-1, h1_a3=-1),
            row(creak=7, cpps=-2, h1_h2=-2, h1_a3=-2),
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(c, expected)
    # 0.1 s -> 5 frames; midpoint frame floor(2.5) = 2; weights 0, 0.5, 1 on frames 2, 3, 4
    c5 = build_conditioning("endcreak", 0.1, PAPER_PRESETS)
    np.testing.assert_array_equal(
        c5,
        np.array(
            [
                row(),
                row(),
                row(),
                row(creak=3.5, cpps=-1, h1_h2=-1, h1_a3=-1),
                row(creak=7, cpps=-2, h1_h2=-2, h1_a3=-2),
            ],
            dtype=np.float32,
        ),
    )


@pytest.mark.parametrize("duration,frames", [(3.0, 150), (3.01, 151), (4.999, 250), (0.005, 1), (0.02, 1), (0.021, 2)])
def test_frame_count_follows_the_duration(duration, frames):
    assert n_frames(duration) == frames
    assert build_conditioning("creaky", duration, PAPER_PRESETS).shape == (frames, 6)


def test_baseline_is_added_to_every_frame_and_default_presets_are_the_papers():
    c = build_conditioning("breathy", 0.1, None, baseline={"pitch": -1.5, "creak": 0.5})
    np.testing.assert_array_equal(
        c, np.tile(np.array(row(creak=-1.5, cpps=-1, h1_h2=3, pitch=-1.5, h1_a3=3), dtype=np.float32), (5, 1))
    )
    with pytest.raises(ValueError, match="unknown phonation condition 'whispery'"):
        build_conditioning("whispery", 1.0, PAPER_PRESETS)
    with pytest.raises(ValueError, match="baseline: unknown feature 'jitter'"):
        build_conditioning("modal", 1.0, PAPER_PRESETS, baseline={"jitter": 1.0})


def test_driver_fits_conditioning_to_the_content_length():
    c = build_conditioning("endcreak", 3.0, PAPER_PRESETS)  # 150 rows
    assert fit_frames(c, 150) is not None and np.array_equal(fit_frames(c, 150), c)
    f = fit_frames(c, 149)  # WavLM gives one frame fewer
    assert f.shape == (149, 6) and f.dtype == np.float32
    np.testing.assert_allclose(f[0], c[0])
    np.testing.assert_allclose(f[-1], row(creak=7, cpps=-2, h1_h2=-2, h1_a3=-2), atol=1e-6)
    assert np.all(f[:70] == 0) and np.all(np.diff(f[:, 0]) >= -1e-6)
    k = build_conditioning("creaky", 3.0, PAPER_PRESETS)
    np.testing.assert_allclose(fit_frames(k, 149), np.tile(k[0], (149, 1)), atol=1e-6)


def test_trim_silence_cuts_quiet_edges_only():
    x = np.concatenate([np.zeros(8000), 0.3 * np.ones(16000), np.zeros(8000)]).astype(np.float32)
    y = trim_silence(x)
    assert 16000 <= len(y) <= 16000 + 1024


# ---------------------------------------------------------------------------
# a fake VQVC checkout (tests only): same module names and call signatures as the
# ones the driver uses, trivial behaviour

FAKE_UTILS = """
import json, os
import hifigan  # like the real utils.py; the checkout has no hifigan, the driver stubs it

class HParams:
    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, HParams(**v) if isinstance(v, dict) else v)
    def keys(self):
        return self.__dict__.keys()
    def __getitem__(self, k):
        return getattr(self, k)

def get_hparams_from_file(path):
    with open(path) as fh:
        return HParams(**json.load(fh))

def load_checkpoint(path, model, optimizer=None, strict=False):
    assert os.path.isfile(path), path
    model.loaded = path
    return model, optimizer, 0.0, 0

def get_content(cmodel, y):
    c = cmodel.extract_features(y.squeeze(1))[0]
    return c.transpose(1, 2)
"""

FAKE_MODELS = """
import os
import numpy as np
import torch

class SynthesizerTrn:
    def __init__(self, spec_channels, segment_size, creak, cpps, h1h2, pitch, h1a3, pitch_var, **kwargs):
        if os.environ.get("FAKE_VQVC_FAIL_LOAD"):
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        assert spec_channels == 641 and segment_size == 28

    def to(self, device):
        return self

    def eval(self):
        return self

    def infer(self, c, g=None, mel=None, c_lengths=None, creaks=None, cpps=None, h1h2s=None, pitches=None,
              h1a3s=None, pitch_vars=None):
        if float(c.abs().max()) == 0.0:
            raise ValueError("fake VQVC: silent content")
        tracks = [creaks, cpps, h1h2s, pitches, h1a3s, pitch_vars]
        assert all(t.shape == (1, 1, c.shape[-1]) and t.dtype == torch.float32 for t in tracks)
        assert g.shape == (1, 256)
        record = os.environ["FAKE_VQVC_RECORD"]
        n = len(os.listdir(record))
        np.save(os.path.join(record, f"{n:03d}.npy"), torch.cat(tracks, 1)[0].T.numpy())
        return 0.5 * c.transpose(1, 2).reshape(1, 1, -1)
"""

FAKE_WAVLM = """
import math
import torch

class WavLMConfig:
    def __init__(self, cfg):
        self.cfg = dict(cfg)

class WavLM:
    def __init__(self, cfg):
        assert cfg.cfg["name"] == "fake-wavlm-large"

    def load_state_dict(self, state):
        assert "w" in state

    def to(self, device):
        return self

    def eval(self):
        return self

    def extract_features(self, y):
        n = y.shape[-1]
        t = math.ceil(n / 320)
        frames = torch.nn.functional.pad(y, (0, t * 320 - n)).reshape(1, t, 320)
        return frames, None
"""

FAKE_SPEAKER = """
import os
import numpy as np

class SpeakerEncoder:
    def __init__(self, weights_fpath, device=None, verbose=True):
        assert os.path.isfile(weights_fpath)

    def embed_utterance(self, wav, return_partials=False, rate=1.3, min_coverage=0.75):
        assert wav.ndim == 1 and len(wav) > 0
        return np.full(256, len(wav) / 16000, dtype=np.float32)
"""

FAKE_CONFIG = {
    "train": {"segment_size": 8960},
    "data": {"sampling_rate": 16000, "filter_length": 1280, "hop_length": 320, "win_length": 1280},
    "model": {
        "inter_channels": 192,
        "ssl_dim": 1024,
        "use_spk": True,
        "creak": True,
        "cpps": True,
        "h1h2": True,
        "pitch": True,
        "h1a3": True,
        "pitch_var": True,
    },
}


def fake_checkout(folder: Path) -> Path:
    (folder / "speaker_encoder").mkdir(parents=True)
    (folder / "wavlm").mkdir()
    (folder / "configs").mkdir()
    (folder / "utils.py").write_text(FAKE_UTILS)
    (folder / "models.py").write_text(FAKE_MODELS)
    (folder / "wavlm" / "__init__.py").write_text(FAKE_WAVLM)
    (folder / "speaker_encoder" / "__init__.py").write_text("")
    (folder / "speaker_encoder" / "voice_encoder.py").write_text(FAKE_SPEAKER)
    (folder / "configs" / "freevc.json").write_text(json.dumps(FAKE_CONFIG))
    return folder


@pytest.fixture
def setup(tmp_path) -> VQVCConfig:
    """A project root with a fake checkout and (fake) checkpoints; this interpreter as VQVC's."""
    import torch

    root = tmp_path / "project"
    fake_checkout(root / "external" / "VQVC")
    models = root / "models" / "vqvc"
    models.mkdir(parents=True)
    (models / "G_VQVC.pth").write_bytes(b"fake generator")
    torch.save({"cfg": {"name": "fake-wavlm-large"}, "model": {"w": torch.zeros(1)}}, models / "WavLM-Large.pt")
    (models / "pretrained_bak_5805000.pt").write_bytes(b"fake speaker encoder")
    return VQVCConfig.from_params({"phonation": {"vqvc": {"python": sys.executable, "device": "cpu"}}}, root=root)


# ---------------------------------------------------------------------------
# config and setup checks


def test_config_from_params_resolves_paths(setup):
    root = setup.root
    assert setup.repo == root / "external" / "VQVC"
    assert setup.checkpoint == root / "models" / "vqvc" / "G_VQVC.pth"
    assert setup.config == root / "external" / "VQVC" / "configs" / "freevc.json"
    assert setup.presets["endcreak"] == PAPER_PRESETS["endcreak"]
    cfg = VQVCConfig.from_params(
        {"vqvc": {"repo": "/abs/VQVC", "python": "envs/vqvc/bin/python", "baseline": {"pitch": -1.0}, "seed": 3}},
        root=root,
    )
    assert cfg.repo == Path("/abs/VQVC") and cfg.python == str(root / "envs/vqvc/bin/python")
    assert cfg.baseline == {"pitch": -1.0} and cfg.seed == 3
    # the authors' notebook (Hfkml/VQVC VQVC.ipynb) drives every conversion with pitch -1.5;
    # a baseline given for other features keeps that pitch
    assert setup.baseline == {"pitch": -1.5}
    assert VQVCConfig.from_params({"vqvc": {"baseline": {"creak": 0.5}}}, root=root).baseline == {
        "pitch": -1.5,
        "creak": 0.5,
    }
    with pytest.raises(ValueError, match="unknown key"):
        VQVCConfig.from_params({"vqvc": {"checkpiont": "x"}}, root=root)
    with pytest.raises(ValueError, match="baseline: unknown feature"):
        VQVCConfig.from_params({"vqvc": {"baseline": {"jitter": 1}}}, root=root)


def test_complete_setup_passes_and_reports(setup):
    check_setup(setup)
    lines = setup_report(setup)
    assert not any(line.startswith("missing") for line in lines)
    assert any("VQVC checkout at external/VQVC" in line for line in lines)
    assert any("not tracked by DVC" in line and "dvc add models/vqvc/G_VQVC.pth" in line for line in lines)
    assert any("hifigan" in line for line in lines)


def _missing_checkout(cfg):
    import shutil

    shutil.rmtree(cfg.repo)


def _freevc_checkout(cfg):
    (cfg.repo / "models.py").write_text("def infer(self, c, g=None, mel=None, c_lengths=None, creaks=None): ...\n")


@pytest.mark.parametrize(
    "breakage,message",
    [
        (
            _missing_checkout,
            "VQVC checkout not found at external/VQVC. Clone it there: `git clone https://github.com/Hfkml/VQVC",
        ),
        (lambda cfg: (cfg.repo / "models.py").unlink(), "external/VQVC is not a VQVC checkout: it has no models.py"),
        (_freevc_checkout, "is not a VQVC checkout: it has a models.py without the voice-quality inputs"),
        (lambda cfg: (cfg.repo / "wavlm" / "__init__.py").unlink(), "the checkout lacks the WavLM code"),
        (
            lambda cfg: (cfg.repo / "configs" / "freevc.json").write_text(
                json.dumps({**FAKE_CONFIG, "model": {**FAKE_CONFIG["model"], "h1a3": False}})
            ),
            "switches off the h1a3 encoder",
        ),
        (
            lambda cfg: cfg.checkpoint.unlink(),
            "VQVC generator checkpoint not found at models/vqvc/G_VQVC.pth. Download G_VQVC.pth from the release of "
            "https://github.com/Hfkml/VQVC.",
        ),
        (lambda cfg: cfg.wavlm.unlink(), "WavLM-Large checkpoint not found at models/vqvc/WavLM-Large.pt"),
        (
            lambda cfg: cfg.speaker_encoder.unlink(),
            "speaker-encoder checkpoint not found at models/vqvc/pretrained_bak_5805000.pt",
        ),
    ],
)
def test_each_missing_piece_has_its_own_message(setup, breakage, message):
    breakage(setup)
    with pytest.raises(SetupError) as err:
        check_setup(setup)
    text = str(err.value)
    assert message in text
    assert text.count("\n- ") == 1, text  # only the broken piece is named
    assert any(line.startswith("missing") and message in line for line in setup_report(setup))


def test_missing_checkpoint_says_how_to_track_or_pull_it(setup):
    setup.checkpoint.unlink()
    with pytest.raises(SetupError, match=r"`dvc add models/vqvc/G_VQVC\.pth`"):
        check_setup(setup)
    Path(f"{setup.checkpoint}.dvc").write_text("outs:\n- path: G_VQVC.pth\n")
    with pytest.raises(SetupError, match=r"tracked by DVC .* run `dvc pull models/vqvc/G_VQVC\.pth\.dvc`"):
        check_setup(setup)


def test_missing_interpreter_messages(setup):
    import dataclasses

    with pytest.raises(SetupError, match="the VQVC interpreter envs/vqvc/bin/python does not exist"):
        check_setup(dataclasses.replace(setup, python=str(setup.root / "envs/vqvc/bin/python")))
    with pytest.raises(SetupError, match="phonation.vqvc.python is not set"):
        check_setup(dataclasses.replace(setup, python=None))


# ---------------------------------------------------------------------------
# the driver, run for real in a subprocess against the fake checkout


def tone(seconds: float, f0: float = 150.0, sr: int = SR) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    return (0.4 * np.sin(2 * np.pi * f0 * t)).astype(np.float32)


def test_convert_batch_end_to_end(setup, tmp_path, monkeypatch):
    record = tmp_path / "received"
    record.mkdir()
    monkeypatch.setenv("FAKE_VQVC_RECORD", str(record))
    monkeypatch.setenv("VOICEBIAS_CHILD_ENV", "FAKE_VQVC_RECORD")  # named, so the driver sees it
    src = tmp_path / "src"
    src.mkdir()
    durations = {"a": 0.5, "b": 0.73, "c": 1.0, "d": 0.61}
    for name, dur in durations.items():
        sf.write(src / f"{name}.wav", tone(dur), SR, subtype="FLOAT")
    sf.write(src / "speaker.wav", tone(2.0, sr=22050), 22050)
    sf.write(src / "silent.wav", np.zeros(8000, dtype=np.float32), SR)
    (src / "broken.wav").write_text("not audio at all")
    out = tmp_path / "out"
    jobs = [
        {"id": "a-breathy", "input": src / "a.wav", "output": out / "a_breathy.wav", "condition": "breathy"},
        {"id": "broken", "input": src / "broken.wav", "output": out / "broken.wav", "condition": "creaky"},
        {"id": "b-creaky", "input": src / "b.wav", "output": out / "b_creaky.wav", "condition": "creaky"},
        {"id": "silent", "input": src / "silent.wav", "output": out / "silent.wav", "condition": "breathy"},
        {"id": "c-endcreak", "input": src / "c.wav", "output": out / "c_endcreak.wav", "condition": "endcreak"},
        {
            "id": "d-modal",
            "input": src / "d.wav",
            "output": out / "d_modal.wav",
            "condition": "modal",
            "speaker": src / "speaker.wav",
        },
    ]
    results = convert_batch(setup, jobs, tmp_path / "work")

    assert [r["id"] for r in results] == [j["id"] for j in jobs]
    status = {r["id"]: r for r in results}
    assert status["broken"]["status"] == "failed" and "cannot read input" in status["broken"]["error"]
    assert not (out / "broken.wav").exists()
    assert status["silent"]["status"] == "failed" and "fake VQVC: silent content" in status["silent"]["error"]
    assert not (out / "silent.wav").exists()
    good = [j for j in jobs if j["id"] not in ("broken", "silent")]
    for job in good:
        r = status[job["id"]]
        assert r["status"] == "ok", r
        y, sr = sf.read(job["output"], dtype="float32")
        x, _ = sf.read(job["input"], dtype="float32")
        assert sr == SR and len(y) >= len(x)
        np.testing.assert_allclose(y[: len(x)], 0.5 * x, atol=2e-4)  # the fake's gain, PCM_16 rounding
        assert r["frames_conditioning"] == r["frames_model"] == n_frames(len(x) / SR)

    received = sorted(record.iterdir())
    assert len(received) == len(good)  # in job order, failures skipped
    for job, path in zip(good, received):
        dur = durations[job["id"][0]]
        expected = build_conditioning(job["condition"], dur, PAPER_PRESETS, baseline={"pitch": -1.5})
        got = np.load(path)
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(np.load(status[job["id"]]["conditioning"]), expected)


def test_driver_failing_as_a_whole_raises_with_its_stderr(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VQVC_RECORD", str(tmp_path))
    monkeypatch.setenv("FAKE_VQVC_FAIL_LOAD", "1")
    monkeypatch.setenv("VOICEBIAS_CHILD_ENV", "FAKE_VQVC_RECORD, FAKE_VQVC_FAIL_LOAD")
    sf.write(tmp_path / "a.wav", tone(0.3), SR)
    with pytest.raises(VQVCError) as err:
        convert_batch(
            setup,
            [{"input": tmp_path / "a.wav", "output": tmp_path / "o.wav", "condition": "creaky"}],
            tmp_path / "work",
        )
    text = str(err.value)
    assert "exit code 2" in text and "after 0 of 1 item(s)" in text
    assert "no kernel image is available" in text


def test_convert_batch_checks_setup_first(setup, tmp_path):
    setup.wavlm.unlink()
    with pytest.raises(SetupError, match="WavLM-Large checkpoint not found"):
        convert_batch(setup, [], tmp_path / "work")
