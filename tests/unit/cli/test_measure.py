"""`voicebias measure`: the instrument on any audio files, against vowels of known F0 and
formants, and the pipeline's refusals (reason codes) for bad audio."""

import io

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import yaml

from tests.fakes.stimuli import synthetic_vowel, vowel_formants
from voicebias import cli, config
from voicebias.cli.measure import TABLE_COLUMNS, active_params, settings_for
from voicebias.contract import MEASURE_COLUMNS
from voicebias.instruments.acoustics import STATUS_COLUMNS, MeasureSettings, measure_file

# Known answers: the source-filter vowel /e/ of tests/fakes/stimuli.py; the male tract
# at 120 Hz, the female tract (formants x 1.17) at 220 Hz.
MALE_F0, FEMALE_F0 = 120.0, 220.0
MALE_E, FEMALE_E = vowel_formants("e", "male"), vowel_formants("e", "female")
# docs/formants.md: F0 within 1 % (this brief's bound for the instrument); F1 within 10 %
# where F0 < 0.8 F1 (true of both cells: 120 < 381, 220 < 446 Hz); F2 and F3 within 5 %.
F0_RTOL, F1_RTOL, F23_RTOL = 0.01, 0.10, 0.05


def _run(argv, capsys):
    rc = cli.main(["measure", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def _table(out: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(out), keep_default_na=False, na_values=[""])


def _assert_known_vowel(row, f0, formants):
    assert row["status"] == "ok" and pd.isna(row["reason"])
    assert row["f0_median_hz"] == pytest.approx(f0, rel=F0_RTOL)
    assert row["f1_hz"] == pytest.approx(formants[0], rel=F1_RTOL)
    assert row["f2_hz"] == pytest.approx(formants[1], rel=F23_RTOL)
    assert row["f3_hz"] == pytest.approx(formants[2], rel=F23_RTOL)
    assert row["f0_median_st"] == pytest.approx(12 * np.log2(f0 / 100.0), abs=12 * np.log2(1 + F0_RTOL))
    assert row["duration_s"] == pytest.approx(1.0, abs=1e-3) and row["voiced_fraction"] > 0.9


@pytest.fixture(scope="module")
def vowels(tmp_path_factory):
    d = tmp_path_factory.mktemp("vowels")
    male, female = d / "male_120.wav", d / "female_220.flac"
    sf.write(male, synthetic_vowel(MALE_F0, MALE_E, seconds=1.0, sr=44100), 44100, subtype="PCM_16")
    sf.write(
        female, synthetic_vowel(FEMALE_F0, FEMALE_E, seconds=1.0, sr=16000), 16000, subtype="PCM_16", format="FLAC"
    )
    return male, female


@pytest.fixture(scope="module")
def bad(tmp_path_factory, vowels):
    """One file per refusal, with the reason code the pipeline gives it."""
    d = tmp_path_factory.mktemp("bad")
    sr = 16000
    sf.write(d / "silence.wav", np.zeros(sr, dtype=np.float32), sr)
    loud = np.clip(4.0 * synthetic_vowel(MALE_F0, MALE_E, seconds=1.0, sr=sr), -1.0, 1.0)
    sf.write(d / "clipped.flac", loud, sr, format="FLAC")
    whole = vowels[0].read_bytes()
    (d / "truncated.wav").write_bytes(whole[: len(whole) // 2])
    (d / "bytes.wav").write_bytes(b"this is not audio, only text that claims to be a WAV file\n" * 20)
    return {
        "silent": d / "silence.wav",
        "clipped": d / "clipped.flac",
        "truncated": d / "truncated.wav",
        "missing": d / "no_such_file.wav",
        "not_audio": d / "bytes.wav",
    }


def test_table_columns_are_the_pipeline_status_and_measure_columns():
    assert TABLE_COLUMNS == ["file", "region", "label", "start_s", "end_s", *STATUS_COLUMNS, *MEASURE_COLUMNS]


def test_gendered_settings_read_known_vowels_wav_44k_and_flac_16k(vowels, capsys, tmp_path):
    male, female = vowels
    rc, out, err = _run([male, "--gender", "male"], capsys)
    assert rc == 0
    t = _table(out)
    assert list(t.columns) == TABLE_COLUMNS and len(t) == 1 and t.loc[0, "file"] == str(male)
    _assert_known_vowel(t.loc[0], MALE_F0, MALE_E)
    assert t.loc[0, "note"] == "resampled from 44100 Hz to 16000 Hz"
    assert "male settings" in err and "params.yaml" in err

    table = tmp_path / "female.csv"
    rc, out, err = _run([female, "--gender", "female", "--out", table], capsys)
    assert rc == 0 and out == "" and str(table) in err
    t = _table(table.read_text())
    assert list(t.columns) == TABLE_COLUMNS
    _assert_known_vowel(t.loc[0], FEMALE_F0, FEMALE_E)
    assert pd.isna(t.loc[0, "note"])  # 16 kHz FLAC: nothing converted
    # the female tract's formant index lies above the male one (octaves re male norms)
    male_index = _table(_run([male, "--gender", "male"], capsys)[1]).loc[0, "formant_index"]
    assert t.loc[0, "formant_index"] - male_index == pytest.approx(np.log2(1.17), abs=0.05)


def test_auto_uses_the_gender_neutral_settings_and_reads_both_vowels(vowels, capsys):
    rc, out, err = _run([*vowels], capsys)  # --gender auto is the default
    assert rc == 0 and "gender-neutral settings" in err
    t = _table(out)
    assert list(t["file"]) == [str(v) for v in vowels]
    _assert_known_vowel(t.loc[0], MALE_F0, MALE_E)
    _assert_known_vowel(t.loc[1], FEMALE_F0, FEMALE_E)


def test_the_row_is_the_pipeline_measurement_of_the_file(vowels, capsys):
    """The command measures through the pipeline's own path: same settings, same numbers."""
    params, _ = active_params(config.ROOT)
    male = vowels[0]
    for gender, settings in (
        ("male", MeasureSettings.for_gender(params["acoustics"], "male")),
        ("auto", MeasureSettings.neutral(params["acoustics"])),
    ):
        assert settings_for(params["acoustics"], gender) == settings
        expected = measure_file(male, settings, int(params["tts"]["sample_rate"]))
        row = _table(_run([male, "--gender", gender], capsys)[1]).loc[0]
        for col in MEASURE_COLUMNS:
            assert row[col] == pytest.approx(expected[col], rel=1e-8), col


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile reads no MP3")
def test_mp3_is_read_where_libsndfile_supports_it(tmp_path, capsys):
    mp3 = tmp_path / "male.mp3"
    sf.write(mp3, synthetic_vowel(MALE_F0, MALE_E, seconds=1.0, sr=44100), 44100, format="MP3")
    rc, out, _ = _run([mp3, "--gender", "male"], capsys)
    assert rc == 0
    row = _table(out).loc[0]
    assert row["f0_median_hz"] == pytest.approx(MALE_F0, rel=F0_RTOL)
    assert row["f2_hz"] == pytest.approx(MALE_E[1], rel=F23_RTOL)


@pytest.mark.parametrize("reason", ["silent", "clipped", "truncated", "missing", "not_audio"])
def test_a_bad_file_alone_is_refused_with_its_reason_and_exits_1(bad, reason, capsys):
    path = bad[reason]
    rc, out, err = _run([path, "--gender", "male"], capsys)
    assert rc == 1
    assert f"voicebias measure: {path}: refused ({reason}):" in err
    assert "Traceback" not in err and "measured 0 of 1" in err
    t = _table(out)
    assert list(t.columns) == TABLE_COLUMNS
    assert (t.loc[0, "status"], t.loc[0, "reason"]) == ("excluded", reason)
    assert t.loc[0, MEASURE_COLUMNS].isna().all()


def test_a_mixed_batch_exits_0_with_the_bad_rows_marked(bad, vowels, capsys, tmp_path):
    reasons = list(bad)
    files = [bad[r] for r in reasons[:2]] + [vowels[0]] + [bad[r] for r in reasons[2:]]  # 6 files: the process pool
    out_csv = tmp_path / "mixed.csv"
    rc, _, err = _run([*files, "--gender", "male", "--out", out_csv], capsys)
    assert rc == 0
    t = _table(out_csv.read_text())
    assert list(t["file"]) == [str(f) for f in files]
    good = t["file"] == str(vowels[0])
    _assert_known_vowel(t[good].iloc[0], MALE_F0, MALE_E)
    assert (t.loc[~good, "status"] == "excluded").all()
    assert list(t.loc[~good, "reason"]) == reasons
    for r in reasons:
        assert f"{bad[r]}: refused ({r}):" in err
    assert "measured 1 of 6 file(s), refused 5" in err


def test_every_file_refused_in_a_batch_exits_1(bad, capsys):
    rc, out, err = _run([*bad.values()], capsys)
    assert rc == 1 and "measured 0 of 5" in err
    assert list(_table(out)["reason"]) == list(bad)


def test_settings_come_from_params_yaml_in_the_working_directory(vowels, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run([vowels[0], "--gender", "male"], capsys)
    assert rc == 0 and "embedded.yaml (no params.yaml in" in err

    params = yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text())
    params["acoustics"]["max_duration_s"] = 0.5  # the 1 s vowel is now too long
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    rc, out, err = _run([vowels[0], "--gender", "male"], capsys)
    assert rc == 1 and f"{tmp_path / 'params.yaml'}" in err and "embedded" not in err
    assert _table(out).loc[0, "reason"] == "too_long"


def test_unknown_gender_is_an_argparse_error(vowels, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["measure", str(vowels[0]), "--gender", "other"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def _cli(*argv, cwd):
    """`voicebias measure ...` as a user runs it: a process of its own (the process pool included)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(config.ROOT)}
    env.pop("VOICEBIAS_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "voicebias.cli", "measure", *map(str, argv)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_very_short_file_is_a_too_short_row_beside_a_measured_one(vowels, tmp_path):
    good, short = tmp_path / "good.wav", tmp_path / "short.wav"
    good.write_bytes(vowels[0].read_bytes())
    t = np.arange(400) / 16000  # 25 ms of a 150 Hz tone: loud, voiced, too short for the pitch analysis
    sf.write(short, (0.3 * np.cos(2 * np.pi * 150 * t)).astype(np.float32), 16000)
    done = _cli(good, short, "--gender", "male", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    table = _table(done.stdout)
    assert list(table["file"]) == [str(good), str(short)]
    _assert_known_vowel(table.iloc[0], MALE_F0, MALE_E)
    assert (table.loc[1, "status"], table.loc[1, "reason"]) == ("excluded", "too_short")
    assert f"{short}: refused (too_short): too short to measure: 25.0 ms" in done.stderr
    assert "measured 1 of 2 file(s), refused 1" in done.stderr


def test_out_naming_a_folder_is_one_line_before_anything_is_measured(vowels, tmp_path):
    done = _cli(vowels[0], "--out", tmp_path, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"voicebias measure: --out {tmp_path} is a folder; give the CSV file to write, e.g. "
        f"--out {tmp_path / 'measures.csv'}"
    ]


def test_a_folder_given_as_audio_is_refused_as_a_folder_not_as_missing(vowels, tmp_path):
    folder = tmp_path / "takes.wav"
    folder.mkdir()
    done = _cli(folder, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    refusals = [line for line in done.stderr.splitlines() if "refused (" in line]
    assert refusals == [f"voicebias measure: {folder}: refused (not_audio): a folder, not an audio file"]
    assert _table(done.stdout).loc[0, "reason"] == "not_audio"
