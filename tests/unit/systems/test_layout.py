"""Preflight checks what it can without a GPU: each repository's checkout layout, its git
submodules and the files named as upstream names them (the cards' `layout` sections)."""

from __future__ import annotations

from tests.fakes import checkouts as fake
from voicebias.cli.preflight import format_checks, preflight
from voicebias.cli.profiles import resolve_profile


def _system_checks(root, system):
    """Preflight of the paper profile on a project root holding this repository's cards."""
    import shutil

    from voicebias.config import ROOT

    if not (root / "models" / "cards").exists():
        shutil.copytree(ROOT / "models" / "cards", root / "models" / "cards")
    return [c for c in preflight(resolve_profile("paper"), root=root) if c.component == f"system:{system}"]


def test_glm4_voice_checkout_without_its_submodule_is_named_in_plain_words(tmp_path):
    fake.glm4_voice_checkout(tmp_path / "external" / "GLM-4-Voice", submodule=False)
    fake.glm4_voice_weights(tmp_path / "models" / "weights" / "glm-4-voice")
    checks = _system_checks(tmp_path, "glm4_voice")
    missing = [c.detail for c in checks if not c.ok and "GPU" not in c.detail]
    assert missing == [
        "external/GLM-4-Voice/third_party/Matcha-TTS is empty: the checkout lacks its git submodule "
        "third_party/Matcha-TTS. Run `git -C external/GLM-4-Voice submodule update --init --recursive` "
        "(or clone with --recurse-submodules)"
    ]
    assert "MISSING  system:glm4_voice: external/GLM-4-Voice/third_party/Matcha-TTS is empty" in format_checks(checks)


def test_a_complete_glm4_voice_layout_passes(tmp_path):
    fake.glm4_voice_checkout(tmp_path / "external" / "GLM-4-Voice")
    fake.glm4_voice_weights(tmp_path / "models" / "weights" / "glm-4-voice")
    checks = _system_checks(tmp_path, "glm4_voice")
    assert [c.detail for c in checks if not c.ok] == ["needs a CUDA GPU; none is visible to PyTorch"] or all(
        c.ok for c in checks
    )
    assert any(
        c.ok and "git submodule external/GLM-4-Voice/third_party/Matcha-TTS checked out" in c.detail for c in checks
    )


def test_files_named_otherwise_than_upstream_are_reported(tmp_path):
    co = fake.glm4_voice_checkout(tmp_path / "external" / "GLM-4-Voice")
    (co / "flow_inference.py").rename(co / "flow_infer.py")
    fake.glm4_voice_weights(tmp_path / "models" / "weights" / "glm-4-voice")
    (tmp_path / "models" / "weights" / "glm-4-voice" / "glm-4-voice-decoder" / "flow.pt").unlink()
    details = [c.detail for c in _system_checks(tmp_path, "glm4_voice") if not c.ok]
    assert any(
        d.startswith(
            "external/GLM-4-Voice/flow_inference.py is missing: the checkout does not have the "
            "layout of THUDM/GLM-4-Voice"
        )
        for d in details
    )
    assert (
        "models/weights/glm-4-voice/glm-4-voice-decoder/flow.pt is missing (the weights layout is in "
        "models/cards/glm4_voice.yaml)"
    ) in details


def test_kimi_audio_needs_the_speech_tokenizer_locally(tmp_path):
    co = fake.kimi_checkout(tmp_path / "external" / "Kimi-Audio", speech_tokenizer=False)
    fake.kimi_weights(tmp_path / "models" / "weights" / "Kimi-Audio-7B-Instruct")
    details = [c.detail for c in _system_checks(tmp_path, "kimi_audio") if not c.ok]
    assert any(
        d.startswith("THUDM/glm-4-voice-tokenizer is not available offline")
        and "external/Kimi-Audio/THUDM/glm-4-voice-tokenizer" in d
        for d in details
    ), details
    local = co / "THUDM" / "glm-4-voice-tokenizer"
    local.mkdir(parents=True)
    (local / "config.json").write_text('{"model_type": "whisper"}')
    assert all(c.ok for c in _system_checks(tmp_path, "kimi_audio") if "GPU" not in c.detail)


def test_every_repository_card_names_what_it_was_verified_against():
    from voicebias.cards import load_card

    for name in (
        "glm4_voice",
        "kimi_audio",
        "spiritlm_base",
        "spiritlm_expressive",
        "step_audio2",
        "speechgpt",
        "vae_gslm",
    ):
        v = load_card(name)["verified_against"]
        assert set(v) == {"repository", "commit", "date", "checked"}, name
        assert len(str(v["commit"]).split()[0]) == 40 and load_card(name)["layout"], name


def test_api_and_transformers_cards_name_the_library_version_they_were_checked_against():
    from importlib.metadata import version

    from voicebias.cards import load_card

    for name, lib in (("gpt_audio", "openai"), ("gemini_live", "google-genai"), ("qwen_omni", "transformers")):
        v = load_card(name)["verified_against"]
        assert v["library"] == lib and str(v["version"]).split()[0] == version(lib), name
