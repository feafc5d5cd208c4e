"""The carrier gate's strict mode: a non-directional content effect on the headline composite."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.gates import gate_inputs
from voicebias.gates.carrier_gate import carrier_gate, require_gate
from voicebias.params import load_params
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
    from voicebias.pipeline.respond import run_stage

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    out = tmp_path / "responses" / "voice_faithful" / "readback"
    for metrics in ({"passed": False, "flips": 2}, {}):
        write_json(tmp_path / "gate.json", metrics)
        with pytest.raises(RuntimeError, match="carrier gate has not passed; no system may hear"):
            run_stage(
                params,
                system="voice_faithful",
                manifest_path=tmp_path / "no-manifest.csv",
                passages_path=config.PASSAGES,
                gate_metrics=tmp_path / "gate.json",
                responses_dir_for=lambda t: out,
                report_for=lambda t: tmp_path / "stats.json",
                planted_truth_path=tmp_path / "planted_truth.json",
                cache_dir=tmp_path / "cache",
                root=tmp_path,
                task_names=["readback"],
            )
        # refused before reading the manifest or writing anything
        assert not out.exists() and not (tmp_path / "stats.json").exists() and not (tmp_path / "cache").exists()
        assert not (tmp_path / "planted_truth.json").exists()


def test_holm_adjustment_matches_r_p_adjust():
    from tests.support.rref import run_r
    from voicebias.gates.carrier_gate import holm

    p = [0.045, 0.179, 0.128, 0.004, float("nan"), 0.03]
    ref = run_r('emit("adj", p.adjust(c(0.045, 0.179, 0.128, 0.004, 0.03), method = "holm"))')["adj"]
    got = holm(p)
    assert got[4] != got[4]  # NaN stays NaN and does not count in the family
    assert [got[i] for i in (0, 1, 2, 3, 5)] == pytest.approx(ref, abs=1e-12)


def _zh_inputs(seed: int, effect: float) -> pd.DataFrame:
    """Clean-TTS-like inputs: a tiny directional content step on the formant index and a
    neutral-cell offset (omnibus significant), nothing on the other channels."""
    rng = np.random.default_rng(seed)
    rows = []
    for step, pole in enumerate(("masculine", "neutral", "feminine")):
        for i in range(10):
            for voice, base in (("male", -1.0), ("female", 1.0)):
                rows.append(
                    {
                        "lang": "zh",
                        "pole": pole,
                        "voice_gender": voice,
                        "stimulus_id": f"{pole}-{i}-{voice}",
                        "status": "ok",
                        "composite": base + rng.normal(0, 0.05),
                        "formant_index": base * 0.1
                        + effect * (step - 1)
                        + (0.01 if pole == "neutral" else 0)
                        + rng.normal(0, 0.012),
                        "f0_median_st": base * 6 + rng.normal(0, 0.2),
                        "margin_acoustic_norms": base * 20 + rng.normal(0, 1.0),
                    }
                )
    return pd.DataFrame(rows)


def test_secondary_channels_are_one_family_but_a_real_leak_still_fails():
    secondary = ["f0_median_st", "formant_index"]
    table, _ = carrier_gate(_zh_inputs(10, 0.0045), ["acoustic_norms"], 0.05, "composite", secondary)
    fi = table[table["measure"] == "formant_index"].iloc[0]
    f0 = table[table["measure"] == "f0_median_st"].iloc[0]
    # raw directional p below .05, but not once the two secondary channels are taken as one family
    assert fi["p_content"] < 0.05 and 0.025 < fi["p_directional"] < 0.05 < fi["p_directional_holm"]
    assert fi["p_directional_holm"] == pytest.approx(2 * fi["p_directional"], rel=1e-12)
    assert f0["p_directional_holm"] == pytest.approx(max(f0["p_directional"], fi["p_directional_holm"]), rel=1e-12)
    assert fi["verdict"] == "benign" and table["verdict"].isin(["pass", "benign"]).all()
    # a leak of a tenth of the voice separation on feminine content fails after adjustment too
    leak = _zh_inputs(10, 0.0045)
    leak.loc[leak["pole"] == "feminine", "formant_index"] += 0.02
    table, _ = carrier_gate(leak, ["acoustic_norms"], 0.05, "composite", secondary)
    assert table.loc[table["measure"] == "formant_index", "verdict"].iloc[0] == "fail"


@pytest.mark.parametrize("leak_st, verdict", [(-1.0, "benign"), (1.0, "fail")])
def test_a_directional_effect_fails_only_toward_the_stereotype(leak_st, verdict):
    """Feminine content 1 st lower in Spanish (a significant directional effect, away from the
    stereotype) is benign; 1 st higher (toward it) fails. The gate reads the direction, not
    only the directional test's significance."""
    table, flips = carrier_gate(gate_inputs(leak_st=leak_st), ["clf"], 0.05, "composite", ["f0_median_st"])
    es = table.set_index(["lang", "measure"]).loc[("es", "composite")]
    assert flips.empty
    assert es["p_content"] < 1e-6 and es["p_directional"] < 1e-6
    assert np.sign(es["fem_minus_masc"]) == np.sign(leak_st)
    assert es["verdict"] == verdict
    assert table.set_index(["lang", "measure"]).loc[("en", "composite"), "verdict"] == "pass"


@pytest.mark.parametrize(
    "leak_st, strict, verdict", [(0.05, False, "negligible"), (0.2, False, "fail"), (0.05, True, "fail")]
)
def test_a_directional_effect_under_one_percent_of_the_voice_separation_is_negligible(leak_st, strict, verdict):
    """On near-deterministic audio (0.01 st within-voice spread) feminine content 0.05 st higher is
    significant and toward the stereotype, but 0.6 % of the 9 st separation between the voices:
    'negligible', which lets the pipeline go on; 0.2 st (2.2 %) fails, and `strict` fails any
    effect on the headline."""
    from voicebias.gates.carrier_gate import NEGLIGIBLE_SHARE, require_gate

    inputs = gate_inputs(leak_st=leak_st, noise_st=0.01)
    table, flips = carrier_gate(inputs, ["clf"], 0.05, "composite", ["f0_median_st"], strict=strict)
    es = table.set_index(["lang", "measure"]).loc[("es", "composite")]
    assert es["p_content"] < 1e-6 and es["p_directional"] < 1e-6 and es["fem_minus_masc"] > 0
    share = es["fem_minus_masc"] / es["voice_separation"]
    assert (share < NEGLIGIBLE_SHARE) == (leak_st == 0.05)
    assert es["verdict"] == verdict
    if verdict == "negligible":
        require_gate(table, flips)  # passes
    else:
        with pytest.raises(Exception, match="carrier gate failed"):
            require_gate(table, flips)
