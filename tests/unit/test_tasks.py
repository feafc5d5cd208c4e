"""Tasks are data: every place that names the tasks names the same ones, and every task can run.

The task names are spelled in data/tasks/prompts.yaml (the tasks themselves),
voicebias.tasks.TASK_NAMES, the `tasks.names` Literal of voicebias.params and
tasks.names of the committed profile; the embedded default's reference systems need
a behaviour for each (docs/extending/task.md).
"""

from __future__ import annotations

import typing

import pandas as pd
import yaml

from voicebias import config
from voicebias.contract import LANGUAGES
from voicebias.params import Tasks
from voicebias.systems.base import S2SRequest
from voicebias.tasks import TASK_NAMES, load_tasks


def test_every_enumeration_of_the_tasks_names_the_same_tasks():
    in_data = set(load_tasks())
    in_schema = set(typing.get_args(typing.get_args(Tasks.model_fields["names"].annotation)[0]))
    in_profile = set(
        yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text(encoding="utf-8"))["tasks"]["names"]
    )
    assert set(TASK_NAMES) == in_data == in_schema, (sorted(TASK_NAMES), sorted(in_data), sorted(in_schema))
    assert in_profile <= in_data


def test_every_task_has_a_prompt_per_language_and_a_valid_output_language():
    for task in load_tasks().values():
        assert task.languages() and set(task.languages()) <= set(LANGUAGES), task.name
        assert all(p.strip() for p in task.prompts.values()), task.name
        assert task.output_lang == "same" or task.output_lang in LANGUAGES, task.name
        assert task.role.strip(), task.name


def test_the_reference_systems_answer_every_task():
    from voicebias.systems.reference import ReferenceSystem

    stimuli = pd.DataFrame(
        [
            {
                "stimulus_id": "en-feminine-01-male",
                "passage_id": "en-feminine-01",
                "lang": "en",
                "pole": "feminine",
                "voice_gender": "male",
            }
        ]
    )
    passages = pd.DataFrame(
        [{"passage_id": "en-feminine-01", "text": "I sew my own clothes.", "gloss_en": "I sew my own clothes."}]
    )
    card = {"adapter": "reference", "output_voice": {"en": "en-us+f2"}}
    system = ReferenceSystem(
        "probe",
        card,
        {"rule": "voice", "error_rate": 0.0, "noncompliance_rate": 0.0, "neutral_p_female": 0.5, "drift_st": 0.0},
        stimuli=stimuli,
        passages=passages,
    )
    for task in load_tasks().values():
        if "en" not in task.prompts:
            continue
        req = S2SRequest(
            "en-feminine-01-male", "en", task.target_lang("en"), task.name, task.prompt("en"), "x", "0" * 64, 1
        )
        assert system.answer_text(req).strip(), task.name
