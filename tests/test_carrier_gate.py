"""The carrier gate's strict mode: a non-directional content effect on the headline composite."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.test_validation import gate_inputs
from voicebias.carrier_gate import carrier_gate, require_gate
from voicebias.validation import ValidationFailed


def neutral_shift(st: float = 1.0) -> pd.DataFrame:
    """Neutral content 1 st higher in English, feminine and masculine content alike: an
    omnibus content effect with no direction toward the stereotype."""
    d = gate_inputs()
    leak = (d["lang"] == "en") & (d["pole"] == "neutral")
    d.loc[leak, "f0_median_st"] += st
    d["composite"] = (d["f0_median_st"] - 8.5) / 4.5
    return d


@pytest.mark.parametrize("strict", [False, True])
def test_strict_mode_fails_any_omnibus_effect_on_the_headline_only(strict):
    table, flips = carrier_gate(neutral_shift(), ["clf"], 0.05, "composite", ["f0_median_st"], strict=strict)
    t = table.set_index(["lang", "measure"])
    en = t.loc[("en", "composite")]
    # the effect is significant as an omnibus test and not directional
    assert en["p_content"] < 1e-6 and abs(en["fem_minus_masc"]) < 0.1 and en["p_directional"] > 0.05
    assert flips.empty
    assert en["verdict"] == ("fail" if strict else "benign")
    # the secondary measure carries the same effect; strict mode concerns the headline only
    assert t.loc[("en", "f0_median_st"), "verdict"] == "benign"
    assert t.loc[("es", "composite"), "verdict"] == "pass"
    if strict:
        assert en["at_fault"] != ""
        with pytest.raises(ValidationFailed, match=r"\[en\] content effect on composite"):
            require_gate(table, flips)
    else:
        require_gate(table, flips)


def test_strict_mode_changes_nothing_on_a_clean_carrier():
    lax, _ = carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["f0_median_st"])
    strict, _ = carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["f0_median_st"], strict=True)
    pd.testing.assert_frame_equal(lax, strict)
    assert set(strict["verdict"]) == {"pass"}


def test_respond_refuses_before_the_carrier_gate_has_passed(tmp_path):
    from voicebias import config
    from voicebias.io import write_json
    from voicebias.respond import run_stage

    params = config.load_params(config.ROOT / "profiles" / "embedded.yaml")
    out = tmp_path / "responses" / "voice_faithful" / "readback"
    for metrics in ({"passed": False, "flips": 2}, {}):
        write_json(tmp_path / "gate.json", metrics)
        with pytest.raises(RuntimeError, match="carrier gate has not passed; no system may hear"):
            run_stage(params, "voice_faithful", "readback", tmp_path / "no-manifest.csv", tmp_path / "no-passages.csv",
                      tmp_path / "gate.json", out, tmp_path / "stats.json", tmp_path / "cache", tmp_path)
        # refused before reading the manifest or writing anything
        assert not out.exists() and not (tmp_path / "stats.json").exists() and not (tmp_path / "cache").exists()
