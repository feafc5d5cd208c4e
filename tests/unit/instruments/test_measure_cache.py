"""The measurement cache: each component of each audio measured once, re-measured only
where its settings or code changed, and a cached table byte-identical to a fresh one."""

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from voicebias.instruments import measure_cache
from voicebias.instruments.acoustics import COMPONENTS, MeasureSettings, measure_files

SR = 16000
SETTINGS = MeasureSettings(75, 400, 5000, 0.01)


def vowel(f0: float, dur: float = 0.6, seed: int = 0) -> np.ndarray:
    t = np.arange(int(dur * SR)) / SR
    y = sum(0.8**k * np.sin(2 * np.pi * (k + 1) * f0 * t + 0.3 * k) for k in range(25) if (k + 1) * f0 < SR / 2)
    y = y + np.random.default_rng(seed).normal(0, 0.002, y.size)
    return (0.3 * y / np.max(np.abs(y))).astype(np.float32)


@pytest.fixture()
def files(tmp_path):
    paths = {}
    for name, f0 in (("a", 120.0), ("b", 210.0), ("c", 150.0)):
        paths[name] = tmp_path / f"{name}.wav"
        sf.write(paths[name], vowel(f0), SR, subtype="FLOAT")
    # the same audio as a, under another name (another system returning the same output)
    paths["a_copy"] = tmp_path / "a_copy.wav"
    paths["a_copy"].write_bytes(paths["a"].read_bytes())
    paths["noise"] = tmp_path / "noise.wav"
    sf.write(
        paths["noise"], (0.1 * np.random.default_rng(3).normal(size=SR // 2)).astype(np.float32), SR, subtype="FLOAT"
    )
    return paths


def run(files, settings, cache_dir, names=("a", "b", "c", "a_copy")):
    df = measure_files([(n, files[n], settings) for n in names], workers=1, cache_dir=cache_dir)
    return df, measure_files.last_counts


def measured(counts):
    return {c: counts["measured"][c] for c in COMPONENTS if counts["measured"][c]}


def test_identical_audio_is_measured_once_and_the_cache_reads_back_the_same_bytes(files, tmp_path):
    fresh = measure_files([(n, files[n], SETTINGS) for n in ("a", "b", "c", "a_copy")], workers=1)
    first, counts = run(files, SETTINGS, tmp_path / "cache")
    # a and a_copy hold the same bytes: three measurements per component, one served twice
    assert measured(counts) == {c: 3 for c in COMPONENTS}
    assert counts["cached"] == {c: 1 for c in COMPONENTS}
    again, counts = run(files, SETTINGS, tmp_path / "cache")
    assert measured(counts) == {}
    assert counts["cached"] == {c: 4 for c in COMPONENTS}
    assert fresh.to_csv(index=False) == first.to_csv(index=False) == again.to_csv(index=False)
    a, copy = first.set_index("id").loc["a"], first.set_index("id").loc["a_copy"]
    assert a.drop(["note"]).equals(copy.drop(["note"]))


@pytest.mark.parametrize(
    "change,touched",
    [
        ({"cpps_time_step": 0.01}, {"cpps"}),
        ({"bandwidths": "measured"}, {"harmonics"}),
        ({"max_formant": 5500.0}, {"formants", "harmonics"}),
        ({"pitch_ceiling": 350.0}, set(COMPONENTS)),
    ],
)
def test_a_changed_setting_re_measures_only_what_it_touches(files, tmp_path, change, touched):
    run(files, SETTINGS, tmp_path / "cache")
    new = replace(SETTINGS, **change)
    df, counts = run(files, new, tmp_path / "cache")
    assert measured(counts) == {c: 3 for c in touched}
    assert all(counts["cached"][c] == 4 for c in COMPONENTS if c not in touched)
    fresh = measure_files([(n, files[n], new) for n in ("a", "b", "c", "a_copy")], workers=1)
    assert df.to_csv(index=False) == fresh.to_csv(index=False)


def test_changed_code_of_one_component_re_measures_that_component(files, tmp_path, monkeypatch):
    run(files, SETTINGS, tmp_path / "cache")
    from voicebias.instruments import acoustics

    code = dict(measure_cache.component_code(acoustics))
    code["cpps"] = "0" * 64
    monkeypatch.setattr(measure_cache, "component_code", lambda instrument: code)
    _, counts = run(files, SETTINGS, tmp_path / "cache")
    assert measured(counts) == {"cpps": 3}
    code["pitch"] = "1" * 64  # every component is built on the pitch track
    _, counts = run(files, SETTINGS, tmp_path / "cache")
    assert measured(counts) == {c: 3 for c in COMPONENTS}


def test_voice_quality_off_measures_pitch_and_formants_only_and_shares_them(files, tmp_path):
    _, counts = run(files, replace(SETTINGS, voice_quality=False), tmp_path / "cache")
    assert measured(counts) == {"pitch": 3, "formants": 3}
    _, counts = run(files, SETTINGS, tmp_path / "cache")
    assert measured(counts) == {"harmonics": 3, "cpps": 3, "hnr": 3}


def test_halves_are_their_own_entries(files, tmp_path):
    jobs = [
        ("a", files["a"], SETTINGS, "whole"),
        ("a1", files["a"], SETTINGS, "first_half"),
        ("a2", files["a"], SETTINGS, "second_half"),
    ]
    df = measure_files(jobs, workers=1, cache_dir=tmp_path / "cache").set_index("id")
    assert measured(measure_files.last_counts) == {c: 3 for c in COMPONENTS}
    assert df.loc["a1", "duration_s"] == pytest.approx(0.3) and df.loc["a", "duration_s"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="first_half"):
        measure_files([("x", files["a"], SETTINGS, "middle")], workers=1, cache_dir=tmp_path / "cache")


def test_exclusions_by_the_signal_are_kept_refusals_by_the_reader_are_not(files, tmp_path):
    cache = tmp_path / "cache"
    df, counts = run(files, SETTINGS, cache, names=("noise",))
    assert df.loc[0, "status"] == "excluded" and df.loc[0, "reason"] == "no_voicing"
    again, counts = run(files, SETTINGS, cache, names=("noise",))
    assert measured(counts) == {} and again.to_csv(index=False) == df.to_csv(index=False)
    # a refusal names the file it read: never served from the cache to another path
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    other = tmp_path / "other.wav"
    other.write_bytes(b"not audio at all")
    one = measure_files([("bad", bad, SETTINGS)], workers=1, cache_dir=cache)
    two = measure_files([("other", other, SETTINGS)], workers=1, cache_dir=cache)
    assert one.loc[0, "reason"] == two.loc[0, "reason"] == "not_audio"
    assert str(other) in two.loc[0, "error"] and str(bad) not in two.loc[0, "error"]


def test_an_unreadable_entry_is_a_miss_and_is_replaced(files, tmp_path):
    cache = tmp_path / "cache"
    first, _ = run(files, SETTINGS, cache, names=("a",))
    entries = sorted((cache / "components").rglob("*.json"))
    assert len(entries) == 1 + len(COMPONENTS)  # the read and each component
    for e in entries:
        e.write_text("{truncated")
    again, counts = run(files, SETTINGS, cache, names=("a",))
    assert measured(counts) == {c: 1 for c in COMPONENTS}
    assert again.to_csv(index=False) == first.to_csv(index=False)


def test_a_stage_measures_only_the_components_it_uses(files, tmp_path):
    df = measure_files(
        [(n, files[n], SETTINGS) for n in ("a", "b")],
        workers=1,
        cache_dir=tmp_path / "c",
        components=("pitch", "formants", "harmonics", "cpps"),
    ).set_index("id")
    assert measured(measure_files.last_counts) == {"pitch": 2, "formants": 2, "harmonics": 2, "cpps": 2}
    assert df["hnr_db"].isna().all() and df["cpps_db"].notna().all()
    full = measure_files([(n, files[n], SETTINGS) for n in ("a", "b")], workers=1).set_index("id")
    assert df.drop(columns="hnr_db").equals(full.drop(columns="hnr_db"))
    with pytest.raises(ValueError, match="must include pitch and formants"):
        measure_files([("a", files["a"], SETTINGS)], workers=1, components=("pitch", "cpps"))
    with pytest.raises(ValueError, match="unknown measure components"):
        measure_files([("a", files["a"], SETTINGS)], workers=1, components=("pitch", "formants", "jitter"))


def _entry_path(cache, key):
    return cache / "components" / key[:2] / f"{key}.json"


def _keys(path, component):
    from voicebias.audio import sha256_file
    from voicebias.instruments import acoustics

    sha = sha256_file(path)
    read = measure_cache.read_key(sha, "whole", SR, SETTINGS, acoustics)
    return read, measure_cache.component_key(component, sha, "whole", SR, SETTINGS, acoustics)


@pytest.mark.parametrize(
    "entry,damage",
    [
        ("read", '{"duration_s": 0.6}'),  # a key missing
        ("read", '{"duration_s": "0.6", "note": ""}'),  # a wrong type
        ("read", '{"duration_s": NaN, "note": ""}'),  # NaN where a value was stored
        ("read", '[0.6, ""]'),  # not an object
        ("pitch", '{"values": {"voiced_fraction": 0.9, "f0_median_hz": 120.0}}'),  # a measure missing
        ("pitch", '{"values": {"voiced_fraction": 0.9, "f0_median_hz": 120.0, "f0_median_st": 3.2, "x": 1.0}}'),
        ("pitch", '{"values": {"voiced_fraction": 0.9, "f0_median_hz": NaN, "f0_median_st": 3.2}}'),
        ("pitch", '{"values": {"voiced_fraction": 0.9, "f0_median_hz": null, "f0_median_st": 3.2}}'),
        ("pitch", '{"values": {"voiced_fraction": 0.9, "f0_median_hz": "120", "f0_median_st": 3.2}}'),
        ("formants", '{"values": {"f1_hz": 500.0, "f2_hz": 1500.0, "f3_hz": Infinity, "formant_index": 0.1}}'),
        ("harmonics", '{"values": [1.0, 2.0, 3.0, 4.0]}'),  # an array for an object
        ("cpps", '{"excluded": ["no_voicing"]}'),  # a wrong array length
        ("cpps", '{"excluded": ["no_voicing", "msg", "extra"]}'),
        ("hnr", '{"excluded": [1, "msg"]}'),
        ("hnr", '{"values": {"hnr_db": 12.0}, "excluded": ["no_voicing", "msg"]}'),  # both kinds at once
        ("hnr", '{"hnr_db": 12.0}'),  # wrong keys
        ("cpps", '"0.5"'),  # not an object
        ("cpps", "not json at all"),
    ],
)
def test_a_wrong_shaped_entry_is_measured_again_and_counted(files, tmp_path, entry, damage):
    cache = tmp_path / "cache"
    first, _ = run(files, SETTINGS, cache, names=("a",))
    read, comp = _keys(files["a"], "cpps" if entry == "read" else entry)
    _entry_path(cache, read if entry == "read" else comp).write_text(damage)
    again, counts = run(files, SETTINGS, cache, names=("a",))
    assert counts["corrupt"] == 1
    assert measured(counts) == {} if entry == "read" else counts["measured"][entry] == 1
    assert again.to_csv(index=False) == first.to_csv(index=False)  # the very values of a fresh measurement
    third, counts = run(files, SETTINGS, cache, names=("a",))
    assert counts["corrupt"] == 0 and measured(counts) == {}  # the entry was replaced by a whole one


def test_a_voice_quality_measure_stored_as_nan_is_a_value_not_damage(files, tmp_path):
    """H1-H2, CPPS and HNR are NaN when no frame can be measured, and the file stays ok:
    such an entry is served as it is."""
    import json

    cache = tmp_path / "cache"
    run(files, SETTINGS, cache, names=("a",))
    _, comp = _keys(files["a"], "hnr")
    _entry_path(cache, comp).write_text(json.dumps({"values": {"hnr_db": float("nan")}}))
    df, counts = run(files, SETTINGS, cache, names=("a",))
    assert counts["corrupt"] == 0 and measured(counts) == {}
    assert df.loc[0, "status"] == "ok" and np.isnan(df.loc[0, "hnr_db"])


def test_a_component_s_code_is_its_module_and_the_instrument_modules_it_imports(tmp_path):
    """The key hashes whole modules found by their imports, so an edit anywhere in a module a
    component uses (a helper, a constant) changes that component's code and no other's."""
    import shutil
    import types

    from voicebias import config
    from voicebias.instruments import acoustics

    names = {c: [p.name for p in files] for c, files in acoustics.component_sources().items()}
    assert names["cpps"] == ["__init__.py", "cepstrum.py", "cpps.py", "jit.py"]
    assert "formants.py" not in names["harmonics"] and "harmonics.py" in names["harmonics"]
    assert names["read"] == ["audio.py"]
    # a copy of the package's numerical code, edited in a module only cpps imports
    root = tmp_path / "copy"
    shutil.copytree(config.ROOT / "voicebias" / "instruments", root / "voicebias" / "instruments")
    shutil.copy(config.ROOT / "voicebias" / "audio.py", root / "voicebias" / "audio.py")
    (root / "voicebias" / "__init__.py").write_text("")

    def copied_instrument():
        sources = {"read": acoustics.code_files("voicebias.audio", root)}
        sources |= {c.name: acoustics.code_files(c.module.__name__, root) for c in acoustics.MEASURE_SET}
        return types.SimpleNamespace(component_sources=lambda: sources)

    before = measure_cache.component_code.__wrapped__(copied_instrument())
    cepstrum = root / "voicebias" / "instruments" / "cepstrum.py"
    cepstrum.write_text(cepstrum.read_text() + "\n\ndef _new_helper():\n    return 1\n")
    after = measure_cache.component_code.__wrapped__(copied_instrument())
    assert {c for c in before if before[c] != after[c]} == {"cpps"}
