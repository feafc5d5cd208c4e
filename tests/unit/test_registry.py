"""Registries: lazy "module:attribute" entries, a uniform unknown-name error, every entry resolvable."""

from __future__ import annotations

import sys

import pytest

from voicebias.errors import NotAvailable, VoicebiasError
from voicebias.registry import Registry, UnknownName


def all_registries() -> dict[str, Registry]:
    from voicebias import tts
    from voicebias.clients import chat
    from voicebias.instruments import classifiers, embeddings, judge
    from voicebias.stimuli import phonation
    from voicebias.systems import catalog, continuation, s2s

    return {
        "tts": tts.REGISTRY,
        "classifiers": classifiers.REGISTRY,
        "embeddings": embeddings.REGISTRY,
        "systems": catalog.ADAPTERS,
        "s2s systems": s2s.S2S_ADAPTERS,
        "continuation systems": continuation.CONTINUATION_ADAPTERS,
        "judges": judge.JUDGES,
        "phonation": phonation.CONVERTERS,
        "llm_backends": chat.BACKENDS,
    }


def test_unknown_name_lists_the_choices_sorted_and_is_a_keyerror():
    reg = Registry("widget", {"zeta": "json:dumps", "alpha": "json:loads"})
    with pytest.raises(UnknownName) as exc:
        reg.get("beta")
    assert str(exc.value) == "unknown widget 'beta'; available: alpha, zeta"
    assert isinstance(exc.value, KeyError) and isinstance(exc.value, VoicebiasError)
    assert exc.value.choices == ["alpha", "zeta"]
    assert reg.names() == ["alpha", "zeta"] and list(reg) == ["alpha", "zeta"] and "zeta" in reg


def test_planned_name_is_not_available():
    reg = Registry("widget", {"a": "json:dumps"}, planned={"b": "next release"})
    with pytest.raises(NotAvailable, match=r"widget 'b' \(next release\)"):
        reg.get("b")
    with pytest.raises(NotImplementedError):
        reg.get("b")


def test_import_happens_only_on_get(tmp_path, monkeypatch):
    (tmp_path / "vb_lazy_probe.py").write_text("LOADED = True\ndef make():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vb_lazy_probe", None)
    reg = Registry("probe", {"p": ("vb_lazy_probe:make", {"size": 3})})
    assert "vb_lazy_probe" not in sys.modules
    assert reg.names() == ["p"] and reg.meta("p") == {"size": 3}
    assert "vb_lazy_probe" not in sys.modules  # listing and metadata import nothing
    assert reg.get("p")() == 42
    assert "vb_lazy_probe" in sys.modules
    sys.modules.pop("vb_lazy_probe", None)


def test_malformed_target_is_refused():
    with pytest.raises(ValueError, match="module:attribute"):
        Registry("widget", {"a": "json.dumps"})


def test_heavy_backends_are_not_imported_by_their_registries():
    import subprocess

    code = (
        "import sys; from voicebias import tts, systems; from voicebias.instruments import classifiers, embeddings; "
        "print(any(m in sys.modules for m in ('torch', 'transformers', 'kokoro', 'resemblyzer')), "
        "'voicebias.tts.kokoro' in sys.modules, 'voicebias.systems.qwen_omni' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]


@pytest.mark.parametrize("registry", sorted(all_registries()))
def test_every_registered_entry_imports_and_resolves(registry):
    reg = all_registries()[registry]
    assert len(reg) > 0
    for name in reg.names():
        obj = reg.get(name)  # a typo in "module:attribute" fails here
        assert callable(obj), (registry, name)


def test_existing_getters_raise_the_registry_error():
    from voicebias.instruments.classifiers import get_classifier
    from voicebias.instruments.embeddings import get_embedder
    from voicebias.systems.catalog import adapter_class
    from voicebias.tts import get_backend

    for fn, kind in (
        (get_backend, "TTS backend"),
        (get_classifier, "classifier"),
        (get_embedder, "speaker embedding"),
        (adapter_class, "adapter"),
    ):
        with pytest.raises(UnknownName, match=f"unknown {kind} 'nope'; available: "):
            fn("nope")


def test_the_catalog_is_the_two_kinds_and_each_adapter_builds_a_system_of_its_kind():
    from voicebias.systems.base import ContinuationSystem, S2SSystem
    from voicebias.systems.catalog import ADAPTERS
    from voicebias.systems.continuation import CONTINUATION_ADAPTERS
    from voicebias.systems.s2s import S2S_ADAPTERS

    assert not set(S2S_ADAPTERS.names()) & set(CONTINUATION_ADAPTERS.names())
    assert ADAPTERS.names() == sorted(S2S_ADAPTERS.names() + CONTINUATION_ADAPTERS.names())
    for reg, base in ((S2S_ADAPTERS, S2SSystem), (CONTINUATION_ADAPTERS, ContinuationSystem)):
        for name in reg.names():
            assert issubclass(reg.get(name), base), name


def test_a_system_of_the_other_kind_is_refused_with_the_adapters_the_stage_takes():
    from voicebias.errors import ConfigError
    from voicebias.systems.build import build_from
    from voicebias.systems.continuation import CONTINUATION_ADAPTERS

    with pytest.raises(
        ConfigError, match="system 'voice_faithful' has adapter 'reference', which is not a continuation"
    ):
        build_from(CONTINUATION_ADAPTERS, "voice_faithful", {})
