"""params.yaml is validated once, with the key path in every message, and defaults live in the schema."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from voicebias import config
from voicebias.cli.profiles import resolve_profile
from voicebias.params import ParamsError, validate_params

EMBEDDED = yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text(encoding="utf-8"))


def problems(raw) -> str:
    with pytest.raises(ParamsError) as info:
        validate_params(raw)
    return str(info.value)


def test_committed_profiles_validate():
    assert (config.ROOT / "params.yaml").read_bytes() == (config.PROFILES_DIR / "embedded.yaml").read_bytes()
    embedded = validate_params(EMBEDDED)
    paper = validate_params(resolve_profile("paper"))
    assert embedded["systems"]["mixed"]["content_weight"] == 0.5
    assert paper["sc_judge"]["backend"] == "gemini" and paper["phonation"]["backend"] == "vqvc"
    full = validate_params(resolve_profile("sc_full"))
    # every NOP_set prompt: 15 categories x 10, in 4 voices and 4 conditions = 2,400 stimuli
    assert full["phonation"]["prompts_per_category"] is None and full["base"]["profile"] == "sc_full"
    assert full["sc_stimuli"]["nop_categories"] * full["sc_stimuli"]["nop_per_category"] == 150
    assert len(full["phonation"]["conditions"]) * sum(len(v) for v in full["sc_stimuli"]["voices"].values()) == 16
    # the paper's two voices per gender (the embedded default has three)
    assert {g: len(v) for g, v in full["sc_stimuli"]["voices"].items()} == {"male": 2, "female": 2}
    assert {g: len(v) for g, v in embedded["sc_stimuli"]["voices"].items()} == {"male": 3, "female": 3}
    assert {k: v for k, v in full.items() if k not in ("phonation", "base", "sc_stimuli")} == {
        k: v for k, v in embedded.items() if k not in ("phonation", "base", "sc_stimuli")
    }
    assert {k: v for k, v in full["sc_stimuli"].items() if k != "voices"} == {
        k: v for k, v in embedded["sc_stimuli"].items() if k != "voices"
    }


def test_a_misspelt_key_is_refused_with_its_path_and_the_likely_key():
    raw = copy.deepcopy(EMBEDDED)
    raw["systems"]["mixed"]["content_wieght"] = 0.9
    msg = problems(raw)
    assert "systems.mixed.content_wieght: unknown key; did you mean content_weight?" in msg


def test_a_wrong_type_is_refused_with_its_path():
    raw = copy.deepcopy(EMBEDDED)
    raw["systems"]["voice_faithful"]["error_rate"] = "high"
    raw["acoustics"]["time_step"] = "fast"
    msg = problems(raw)
    assert "systems.voice_faithful.error_rate: expected a number, got 'high'" in msg
    assert "acoustics.time_step: expected a number, got 'fast'" in msg


def test_out_of_range_values_and_unknown_choices_are_refused():
    raw = copy.deepcopy(EMBEDDED)
    raw["systems"]["content_driven"]["error_rate"] = 1.5
    raw["phonation"]["backend"] = "vqvs"
    raw["base"]["languages"] = ["en", "fr"]
    msg = problems(raw)
    assert "systems.content_driven.error_rate:" in msg and "less than or equal to 1" in msg
    assert "phonation.backend: 'vqvs' is not one of" in msg
    assert "base.languages.1: 'fr' is not one of" in msg


def test_every_problem_is_listed_at_once_and_sections_are_required():
    raw = copy.deepcopy(EMBEDDED)
    del raw["carrier_gate"]["measures"]
    raw["tts"]["sample_rat"] = 16000
    raw["run"]["systems"].append("ghost")
    msg = problems(raw)
    assert "carrier_gate.measures: required setting is missing" in msg
    assert "tts.sample_rat: unknown key; did you mean sample_rate?" in msg
    assert "run.systems: 'ghost' has no section systems.ghost" in msg
    assert msg.startswith("params.yaml: 3 problem(s)")


def test_a_mixed_system_without_its_weight_is_refused():
    raw = copy.deepcopy(EMBEDDED)
    del raw["systems"]["mixed"]["content_weight"]
    assert "rule 'mixed' needs content_weight" in problems(raw)


def test_defaults_come_from_the_schema():
    raw = copy.deepcopy(EMBEDDED)
    del raw["sc_judge"]
    del raw["systems"]["voice_faithful"]["noncompliance_rate"]
    params = validate_params(raw)
    assert params["sc_judge"]["backend"] == "lexical_heuristic" and params["sc_judge"]["max_concurrency"] == 1
    assert params["systems"]["voice_faithful"]["noncompliance_rate"] == 0.0
    # optional settings left unset stay absent, so they never enter a system's cache key
    assert "content_weight" not in params["systems"]["voice_faithful"]


def test_a_system_is_checked_against_its_adapter(tmp_path):
    raw = copy.deepcopy(EMBEDDED)
    raw["systems"]["drifting"]["speaker"] = "Chelsie"  # a Qwen-Omni setting, not a reference system's
    assert "systems.drifting.speaker: unknown key" in problems(raw)


@pytest.mark.parametrize(
    "mutation, expected",
    [
        ({"content_wieght": 0.9}, "systems.mixed.content_wieght: unknown key; did you mean content_weight?"),
        ({"error_rate": "high"}, "systems.mixed.error_rate: expected a number, got 'high'"),
    ],
)
def test_preflight_stops_on_a_bad_key(tmp_path, mutation, expected):
    raw = copy.deepcopy(EMBEDDED)
    raw["systems"]["mixed"].update(mutation)
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    (root / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    (root / "models").symlink_to(config.ROOT / "models")
    env = {"PATH": f"{config.ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "VOICEBIAS_ROOT": str(root)}
    res = subprocess.run(
        [sys.executable, "-m", "voicebias.cli", "preflight"], cwd=root, env=env, capture_output=True, text=True
    )
    assert res.returncode == 1
    assert expected in res.stderr and "Traceback" not in res.stderr


def _literal_names(annotation) -> set[str]:
    """Every string a Literal (possibly inside list[...], dict[...] or a union) admits."""
    import typing

    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_literal_names(a) for a in typing.get_args(annotation)), set())


def test_each_backend_name_the_schema_admits_is_its_registry_s():
    """The schema names what the lower layers' registries hold, so a misspelt backend stops at
    validation and a registry entry added without the schema's name fails here."""
    from voicebias import params as P
    from voicebias import tts
    from voicebias.clients import chat
    from voicebias.instruments import classifiers, embeddings, judge
    from voicebias.stimuli import phonation

    fields = {
        (P.TTS, "backend"): tts.REGISTRY,
        (P.SCStimuli, "backend"): tts.REGISTRY,
        (P.Acoustics, "classifier"): classifiers.REGISTRY,
        (P.Acoustics, "classifier_weights"): classifiers.REGISTRY,
        (P.Acoustics, "speaker_embedding"): embeddings.REGISTRY,
        (P.SCJudge, "backend"): judge.JUDGES,
        (P.Phonation, "backend"): phonation.CONVERTERS,
        (P.LLMEndpoint, "backend"): chat.BACKENDS,
    }
    for (model, field), registry in fields.items():
        admitted = _literal_names(model.model_fields[field].annotation)
        assert admitted == set(registry.names()), (model.__name__, field)


def test_task_names_are_the_prompt_file_s():
    from voicebias import params as P
    from voicebias.tasks import load_tasks

    assert _literal_names(P.TaskName) == set(load_tasks())
    raw = copy.deepcopy(EMBEDDED)
    raw["tasks"]["names"] = ["readback", "descibe"]
    assert "tasks.names.1" in problems(raw)
    raw = copy.deepcopy(EMBEDDED)
    raw["acoustics"]["classifier"] = "acoustic_norm"
    assert "acoustics.classifier" in problems(raw)


def test_consumers_take_their_defaults_from_the_schema():
    from voicebias.instruments.acoustics import MeasureSettings
    from voicebias.params import Acoustics, Retry
    from voicebias.systems.runner import RetryPolicy

    section = {"pitch_range": {"male": [75, 300], "female": [100, 500]}, "max_formant": {"male": 5000, "female": 5500}}
    s = MeasureSettings.for_gender(section, "female")
    for field in ("time_step", "max_duration_s", "max_clipped_fraction", "silence_dbfs", "bandwidths"):
        assert getattr(s, field) == Acoustics.model_fields[field].default, field
        assert getattr(MeasureSettings(), field) == Acoustics.model_fields[field].default, field
    n = MeasureSettings.neutral(section)
    assert (n.pitch_floor, n.pitch_ceiling) == Acoustics.model_fields["neutral_pitch_range"].default
    assert n.octave_check_st == Acoustics.model_fields["octave_check_st"].default
    assert RetryPolicy.from_params({}) == RetryPolicy() == RetryPolicy(**Retry().model_dump())
    with pytest.raises(ParamsError, match="retry.max_attempt"):
        RetryPolicy.from_params({"retry": {"max_attempt": 3}})


def test_a_stated_label_order_is_validated_as_the_classifier_reads_it():
    """acoustics.classifier_labels (read by voicebias.instruments.acoustics.add_margins for checkpoints
    with generic label names) is part of the schema: a complete order passes, a partial or repeated one
    is refused with its path, and an unknown classifier name too."""
    raw = copy.deepcopy(EMBEDDED)
    raw["acoustics"]["classifier_labels"] = {"w2v2_commonvoice": {"female": 1, "male": 0}}
    assert validate_params(raw)["acoustics"]["classifier_labels"] == {"w2v2_commonvoice": {"female": 1, "male": 0}}
    raw["acoustics"]["classifier_labels"] = {"w2v2_commonvoice": {"female": 0}}
    assert "acoustics.classifier_labels" in problems(raw)
    raw["acoustics"]["classifier_labels"] = {"w2v2_commonvoice": {"female": 0, "male": 0}}
    assert "distinct class indices" in problems(raw)
    raw["acoustics"]["classifier_labels"] = {"w2v2_libri": {"female": 0, "male": 1}}
    assert "acoustics.classifier_labels" in problems(raw)
