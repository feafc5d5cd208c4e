"""Qwen2.5-Omni adapter: loading is checked before any call, with one clear message per problem.

Not covered here: generation itself. A tiny Qwen2.5-Omni needs a locally built
thinker, talker and token2wav plus a Qwen2 tokenizer carrying the model's audio
special tokens and chat template; building that offline was out of this issue's
reach, so only the setup path (folder, model type, GPU, lazy loading) is tested.
"""

from __future__ import annotations

import json

import pytest

from voicebias.systems import SetupError, build_system


def test_missing_weights_folder_is_named(tmp_path):
    with pytest.raises(SetupError, match="Qwen2.5-Omni weights expected at .*Qwen2.5-Omni-7B are missing"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)


def test_a_folder_with_another_model_is_refused(tmp_path):
    folder = tmp_path / "models" / "weights" / "Qwen2.5-Omni-7B"
    folder.mkdir(parents=True)
    with pytest.raises(SetupError, match="no config.json"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_audio"}))
    with pytest.raises(SetupError, match="'qwen2_audio' model, not Qwen2.5-Omni"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)


def test_gpu_requirement_and_lazy_loading(tmp_path):
    import torch

    folder = tmp_path / "models" / "weights" / "Qwen2.5-Omni-7B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match="needs a CUDA GPU"):
            build_system("qwen_omni", {}, root=tmp_path)
    system = build_system("qwen_omni", {"device": "cpu", "speaker": "Ethan"}, root=tmp_path)
    assert system._model is None and system.speaker == "Ethan"  # nothing loaded until a call needs it
    assert system.revision.startswith("Qwen2.5-Omni-7B@config-")
    # the first real call loads the folder, and an incomplete folder is a setup error (the stage stops)
    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.base import S2SRequest

    s = make_stimuli(tmp_path, 1).iloc[0]
    with pytest.raises(SetupError, match="cannot be loaded"):
        system.respond(S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 1))
