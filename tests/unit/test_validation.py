"""Data gates: the passage table and the carrier gate stop with readable summaries."""

import numpy as np
import pandas as pd
import pytest

from tests.support.gates import gate_inputs
from voicebias import config
from voicebias.gates.carrier_gate import carrier_gate, require_gate
from voicebias.params import load_params
from voicebias.stimuli.bank import load_bank, validate_passages
from voicebias.validation import ValidationFailed

WINDOW = load_params(config.ROOT / "profiles" / "embedded.yaml")["bank"]["length_window"]


@pytest.fixture(scope="module")
def bank():
    return load_bank(config.BANK_DIR)


def test_shipped_bank_passes(bank):
    report = validate_passages(bank, WINDOW)
    assert report.success and len(bank) == 90
    assert bank.groupby(["lang", "pole"]).size().eq(10).all()


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d.assign(pole=d["pole"].where(d.index != 3, "androgynous")), "pole"),
        (lambda d: d.assign(text=d["text"].where(d.index != 0, d.loc[0, "text"] + " She agreed.")), "text"),
        (lambda d: d.drop(columns=["gloss_en"]), "gloss_en"),
        (lambda d: pd.concat([d, d.iloc[[0]]], ignore_index=True), "passage_id"),
        (lambda d: d.assign(length_units=d["length_units"].where(d.index != 5, 3)), "length_units"),
    ],
)
def test_broken_passage_tables_are_rejected(bank, mutate, needle):
    with pytest.raises(ValidationFailed) as err:
        validate_passages(mutate(bank.copy()), WINDOW)
    assert needle in str(err.value)


def test_gate_passes_clean_carrier():
    table, flips = carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["f0_median_st", "margin_clf"])
    assert set(table["verdict"]) <= {"pass", "benign", "negligible"} and flips.empty
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


def test_gate_runs_per_phonation_condition():
    """A leak confined to one phonation condition is caught and named with that condition."""
    frames = []
    for i, phonation in enumerate(("modal", "breathy", "creaky", "endcreak")):
        d = gate_inputs(seed=100 + i)
        d = d[d["lang"] == "en"].assign(phonation=phonation)
        if phonation == "breathy":
            d.loc[d["pole"] == "feminine", "f0_median_st"] += 1.0
            d["composite"] = (d["f0_median_st"] - 8.5) / 4.5
        frames.append(d)
    inputs = pd.concat(frames, ignore_index=True)
    table, flips = carrier_gate(inputs, ["clf"], 0.05, "composite", ["f0_median_st"])
    assert set(table["phonation"]) == {"modal", "breathy", "creaky", "endcreak"}
    assert (table.groupby("phonation")["n"].max() == 60).all()
    failed = table[table["verdict"] == "fail"]
    assert set(failed["phonation"]) == {"breathy"} and {"composite", "f0_median_st"} <= set(failed["measure"])
    with pytest.raises(ValidationFailed, match=r"\[en, breathy\] content effect on composite"):
        require_gate(table, flips)


def test_gate_without_phonation_reads_all_and_names_missing_measures():
    table, _ = carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["f0_median_st"])
    assert set(table["phonation"]) == {"all"}
    with pytest.raises(KeyError, match="no column.*formant_index"):
        carrier_gate(gate_inputs(), ["clf"], 0.05, "composite", ["formant_index"])


PASSAGES_PER_POLE = 4


@pytest.fixture(scope="module")
def espeak_carrier(tmp_path_factory, bank):
    """First sentences of 4 English passages per pole, read by eSpeak's male and female voice."""
    from voicebias.audio import normalize_rms, resample
    from voicebias.tts import get_backend

    tts = get_backend("espeak", rate_wpm=160)
    voices = {"male": "en-us+m3", "female": "en-us+f3"}
    signals, rows = {}, []
    en = bank[bank["lang"] == "en"]
    for pole in ("masculine", "neutral", "feminine"):
        for p in en[en["pole"] == pole].head(PASSAGES_PER_POLE).itertuples():
            sentence = p.text.split(". ")[0].rstrip(".") + "."
            for gender, voice in voices.items():
                x, sr = tts.synthesize(sentence, voice)
                x, _ = normalize_rms(resample(x, sr, 16000), -23.0)
                sid = f"{p.passage_id}-{gender}"
                signals[sid] = x
                rows.append(
                    {
                        "stimulus_id": sid,
                        "passage_id": p.passage_id,
                        "lang": "en",
                        "pole": pole,
                        "voice_gender": gender,
                        "voice_id": voice,
                        "path": f"data/stimuli/audio/{sid}.flac",
                    }
                )
    return signals, pd.DataFrame(rows), tmp_path_factory.mktemp("carrier")


def _measure_carrier(root, signals, manifest, leak_semitones):
    """Write the stimuli (feminine content pitch-raised by `leak_semitones`, a leaky
    carrier) and run the real acoustics stage on them."""
    import parselmouth
    import yaml
    from parselmouth.praat import call

    from voicebias.audio import write_audio
    from voicebias.pipeline.acoustics import run_stage

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    for r in manifest.itertuples():
        x = signals[r.stimulus_id]
        if leak_semitones and r.pole == "feminine":
            lo, hi = params["acoustics"]["pitch_range"][r.voice_gender]
            snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=16000)
            median = call(snd.to_pitch(0.01, lo, hi), "Get quantile", 0, 0, 0.5, "Hertz")
            # Praat's PSOLA "Change gender": new pitch median, formants and duration kept
            snd = call(snd, "Change gender", lo, hi, 1.0, median * 2 ** (leak_semitones / 12), 1.0, 1.0)
            x = snd.values[0].astype(np.float32)
        write_audio(root / r.path, x, 16000)
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    (root / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    manifest.to_csv(root / "manifest.csv", index=False)
    return run_stage(
        params,
        manifest_path=root / "manifest.csv",
        out_measures=root / "data" / "measures" / "inputs.csv",
        out_reference=root / "data" / "measures" / "composite_reference.csv",
        root=root,
    ), params


def _gate_stage(root):
    import os
    import subprocess
    import sys

    env = {**os.environ, "VOICEBIAS_ROOT": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "stages.carrier_gate"], cwd=config.ROOT, env=env, capture_output=True, text=True
    )


def test_gate_on_espeak_audio_passes_clean_and_stops_a_leaky_carrier(espeak_carrier):
    signals, manifest, base = espeak_carrier
    clean_root, leaky_root = base / "clean", base / "leaky"
    clean, params = _measure_carrier(clean_root, signals, manifest, 0.0)
    assert (clean["status"] == "ok").all()
    classifiers = [params["acoustics"]["classifier"]]
    secondary = [m for m in params["carrier_gate"]["measures"] if m != "composite"]
    table, flips = carrier_gate(clean, classifiers, 0.05, "composite", secondary)
    assert set(table["verdict"]) <= {"pass", "benign", "negligible"} and flips.empty
    res = _gate_stage(clean_root)
    assert res.returncode == 0, res.stderr[-2000:]

    leaky, _ = _measure_carrier(leaky_root, signals, manifest, 1.0)
    fem = leaky["pole"] == "feminine"
    raised = leaky.loc[fem, "f0_median_st"].to_numpy() - clean.loc[fem, "f0_median_st"].to_numpy()
    assert raised == pytest.approx(np.ones(fem.sum()), abs=0.25)  # the planted leak is there
    table, _ = carrier_gate(leaky, classifiers, 0.05, "composite", secondary)
    failed = table[table["verdict"] == "fail"]
    assert "f0_median_st" in set(failed["measure"])
    res = _gate_stage(leaky_root)
    assert res.returncode != 0
    assert "carrier gate failed" in res.stderr and "[en] content effect on f0_median_st" in res.stderr
    assert "most shifted feminine-content stimuli: en-feminine-" in res.stderr
    assert "Traceback" not in res.stderr


def test_gate_defers_what_great_expectations_only_imports():
    """A stage that validates a table does not load scipy.stats for Great Expectations
    (about 0.7 s each stage); a gate still fails a bad table, and scipy.stats
    loads in full on first use, with the values of a normal import."""
    import subprocess
    import sys

    code = """
import sys
import pandas as pd
from voicebias import validation as V
E = V.expectations()
bad = V.validate_table(pd.DataFrame({"a": [1, None]}), "t", [E.ExpectColumnValuesToNotBeNull(column="a")])
assert not bad.success and bad.failures[0]["unexpected_count"] == 1, bad
lazy = [n for n in V.DEFERRED_BY_GX if type(sys.modules[n]).__name__ == "_LazyModule"]
from scipy.stats import norm
import scipy.stats
print(",".join(lazy), repr(float(norm.ppf(0.975))), type(scipy.stats).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=config.ROOT, check=True)
    lazy, ppf, kind = out.stdout.split()
    assert lazy == "scipy.stats"
    assert float(ppf) == 1.959963984540054 and kind == "module"


def test_deferring_leaves_imported_and_missing_modules_alone():
    import sys

    from voicebias.validation import _deferred

    before = sys.modules["pandas"]
    _deferred("pandas")
    _deferred("no_such_module_voicebias")
    assert sys.modules["pandas"] is before and "no_such_module_voicebias" not in sys.modules
