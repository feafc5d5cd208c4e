"""Data gates: the passage table and the carrier gate stop with readable summaries."""

import numpy as np
import pandas as pd
import pytest

from voicebias import config
from voicebias.bank import load_bank, validate_passages
from voicebias.carrier_gate import carrier_gate, require_gate
from voicebias.validation import ValidationFailed

WINDOW = config.load_params(config.ROOT / "profiles" / "embedded.yaml")["bank"]["length_window"]


@pytest.fixture(scope="module")
def bank():
    return load_bank(config.BANK_DIR)


def test_shipped_bank_passes(bank):
    report = validate_passages(bank, WINDOW)
    assert report.success and len(bank) == 90
    assert bank.groupby(["lang", "pole"]).size().eq(10).all()


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.assign(pole=d["pole"].where(d.index != 3, "androgynous")), "pole"),
    (lambda d: d.assign(text=d["text"].where(d.index != 0, d.loc[0, "text"] + " She agreed.")), "text"),
    (lambda d: d.drop(columns=["gloss_en"]), "gloss_en"),
    (lambda d: pd.concat([d, d.iloc[[0]]], ignore_index=True), "passage_id"),
    (lambda d: d.assign(length_units=d["length_units"].where(d.index != 5, 3)), "length_units"),
])
def test_broken_passage_tables_are_rejected(bank, mutate, needle):
    with pytest.raises(ValidationFailed) as err:
        validate_passages(mutate(bank.copy()), WINDOW)
    assert needle in str(err.value)


def gate_inputs(leak_st=0.0, flip=None, seed=3):
    """60 inputs per language with no content effect, or a planted pitch leak for feminine content."""
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "es"):
        for pole in ("masculine", "neutral", "feminine"):
            for voice, f0 in (("male", 4.0), ("female", 13.0)):
                for i in range(10):
                    st = f0 + rng.normal(0, 0.3) + (leak_st if pole == "feminine" and lang == "es" else 0.0)
                    margin = (st - 8.5) * 3
                    sid = f"{lang}-{pole}-{i:02d}-{voice}"
                    if sid == flip:
                        margin = -margin
                    rows.append({"stimulus_id": sid, "lang": lang, "pole": pole, "voice_gender": voice, "status": "ok",
                                 "f0_median_st": st, "margin_clf": margin, "composite": (st - 8.5) / 4.5})
    return pd.DataFrame(rows)


def test_gate_passes_clean_carrier():
    table, flips = carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["f0_median_st", "margin_clf"])
    assert set(table["verdict"]) <= {"pass", "benign"} and flips.empty
    require_gate(table, flips)


def test_gate_stops_on_planted_pitch_leak():
    table, flips = carrier_gate(gate_inputs(leak_st=1.0), ["clf"], 0.05, "composite", ["f0_median_st", "margin_clf"])
    failed = table[table["verdict"] == "fail"]
    assert set(failed["lang"]) == {"es"} and "composite" in set(failed["measure"])
    with pytest.raises(ValidationFailed, match=r"\[es\] content effect on composite"):
        require_gate(table, flips)


def test_gate_names_flipped_stimuli():
    table, flips = carrier_gate(gate_inputs(flip="en-neutral-03-female"), ["clf"], 0.05, "composite", ["f0_median_st"])
    assert list(flips["stimulus_id"]) == ["en-neutral-03-female"]
    with pytest.raises(ValidationFailed, match="en-neutral-03-female"):
        require_gate(table, flips)
