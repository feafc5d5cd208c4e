"""Speaker embeddings: Resemblyzer's packaged GE2E encoder on eSpeak voices, SpeechBrain
ECAPA loaded from a local folder (randomly initialised weights saved in the hub layout),
and the cosine helpers."""

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch

from tests.support.instruments import build_ecapa_folder
from voicebias.instruments.embeddings import cosine_matrix, cosine_similarity, get_embedder, speaker_similarity
from voicebias.tts import get_backend

SR = 16000
TEXT_A = "Every morning I check the rods and climb down into the hull before the others wake."
TEXT_B = "My grandmother taught me to bake bread on Sundays, and I still use her recipe."


@pytest.fixture(scope="module")
def espeak_voices():
    tts = get_backend("espeak", rate_wpm=160)
    out = {}
    for voice in ("en-us+m3", "en-us+m7", "en-us+f3"):
        for key, text in (("A", TEXT_A), ("B", TEXT_B)):
            out[(voice, key)], sr = tts.synthesize(text, voice)
    return out, sr


def test_resemblyzer_same_voice_is_closer_than_another_voice(espeak_voices):
    sigs, sr = espeak_voices
    emb = get_embedder("resemblyzer")
    E = {k: emb.embed(x, sr) for k, x in sigs.items()}
    assert E[("en-us+m3", "A")].shape == (256,)
    same_voice = cosine_similarity(E[("en-us+m3", "A")], E[("en-us+m3", "B")])
    other_male = cosine_similarity(E[("en-us+m3", "A")], E[("en-us+m7", "A")])
    other_gender = cosine_similarity(E[("en-us+m3", "A")], E[("en-us+f3", "A")])
    # same voice on different texts beats a different voice on the same text
    assert same_voice > other_male + 0.05 and same_voice > other_gender + 0.05
    assert cosine_similarity(E[("en-us+f3", "A")], E[("en-us+f3", "B")]) > other_gender + 0.05
    # resampling to 16 kHz is part of the path: the same audio at 16 kHz embeds alike
    from voicebias.audio import resample

    again = emb.embed(resample(sigs[("en-us+m3", "A")], sr, SR), SR)
    assert cosine_similarity(again, E[("en-us+m3", "A")]) > 0.99


def test_speaker_similarity_table_excludes_bad_files(tmp_path, espeak_voices):
    sigs, sr = espeak_voices
    for name, key in (("a.flac", ("en-us+f3", "A")), ("b.flac", ("en-us+f3", "B"))):
        sf.write(tmp_path / name, sigs[key], sr)
    (tmp_path / "junk.flac").write_bytes(b"not audio")
    pairs = pd.DataFrame({"reference_path": ["a.flac", "a.flac"], "output_path": ["b.flac", "junk.flac"]})
    out = speaker_similarity(pairs, get_embedder("resemblyzer"), root=tmp_path)
    assert list(out["status"]) == ["ok", "excluded"]
    assert 0.7 < out.loc[0, "speaker_similarity"] <= 1.0 and np.isnan(out.loc[1, "speaker_similarity"])
    assert "not a readable audio file" in out.loc[1, "error"]


def test_ecapa_loads_the_saved_weights_from_a_local_folder(tmp_path):
    """What is tested: the local-folder loading path and inference, against the saved
    network run directly (random weights: speaker discrimination is not testable offline)."""
    from speechbrain.lobes.features import Fbank
    from speechbrain.processing.features import InputNormalization

    folder = tmp_path / "spkrec-ecapa-voxceleb"
    model = build_ecapa_folder(folder)
    before = sorted(p.name for p in folder.iterdir())
    emb = get_embedder("ecapa", weights=folder, savedir=tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == before  # the weights folder is left untouched
    x = (0.3 * np.sin(2 * np.pi * 150 * np.arange(SR) / SR)).astype(np.float32)
    v = emb.embed(x, SR)
    with torch.no_grad():
        feats = InputNormalization(norm_type="sentence", std_norm=False)(
            Fbank(n_mels=80)(torch.from_numpy(x)[None]), torch.ones(1)
        )
        direct = model(feats).reshape(-1).numpy()
    assert v.shape == (192,)
    np.testing.assert_allclose(v, direct, atol=1e-5)
    # a differently seeded network gives other embeddings: the saved weights were used
    other = build_ecapa_folder(tmp_path / "other", seed=1)
    with torch.no_grad():
        assert not np.allclose(other(feats).reshape(-1).numpy(), v, atol=1e-3)


def test_ecapa_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="weights folder .* not found.*spkrec-ecapa-voxceleb"):
        get_embedder("ecapa", weights=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="speaker_embedding_weights"):
        get_embedder("ecapa")
    with pytest.raises(KeyError, match="unknown speaker embedding"):
        get_embedder("xvector")


def test_cosine_helpers_closed_forms():
    assert cosine_similarity([1, 0], [0, 2]) == pytest.approx(0.0)
    assert cosine_similarity([1, 1], [2, 2]) == pytest.approx(1.0)
    assert cosine_similarity([1, 0], [1, 1]) == pytest.approx(1 / np.sqrt(2))
    assert cosine_similarity([3, 4], [-3, -4]) == pytest.approx(-1.0)
    M = cosine_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 1.0]]))
    np.testing.assert_allclose(M, [[1 / np.sqrt(2)], [1 / np.sqrt(2)]])
    np.testing.assert_allclose(np.diag(cosine_matrix(np.random.default_rng(0).normal(size=(4, 8)))), 1.0)
    with pytest.raises(ValueError, match="differ in size"):
        cosine_similarity([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="zero vector"):
        cosine_similarity([0, 0], [1, 2])


class CountingEmbedder:
    """A deterministic stand-in (spectral band energies) that counts its calls."""

    name, dim = "counting", 4

    def __init__(self, tag="a"):
        self.calls, self.tag = 0, tag

    def identity(self):
        return {"name": self.name, "tag": self.tag}

    def embed(self, x, sr):
        self.calls += 1
        spec = np.abs(np.fft.rfft(np.asarray(x, dtype=np.float64)))
        return np.array([b.sum() for b in np.array_split(spec, 4)]) / (spec.sum() + 1e-12) + np.pi / 7


def test_embedding_cache_embeds_each_audio_once_and_reads_back_the_same_floats(tmp_path):
    import soundfile as sf

    from voicebias.instruments.embeddings import embed_files

    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        sf.write(tmp_path / f"{name}.wav", rng.normal(0, 0.1, 8000).astype(np.float32), 16000, subtype="FLOAT")
    (tmp_path / "a_copy.wav").write_bytes((tmp_path / "a.wav").read_bytes())
    (tmp_path / "bad.wav").write_bytes(b"no audio")
    paths = ["a.wav", "b.wav", "a_copy.wav", "bad.wav"]
    cache = tmp_path / "cache"
    fresh, fresh_err = embed_files(paths, CountingEmbedder(), tmp_path)
    emb = CountingEmbedder()
    first, first_err = embed_files(paths, emb, tmp_path, cache_dir=cache)
    assert emb.calls == 2  # a_copy holds a's bytes
    again = CountingEmbedder()
    second, second_err = embed_files(paths, again, tmp_path, cache_dir=cache)
    assert again.calls == 0
    for p in ("a.wav", "b.wav", "a_copy.wav"):
        assert fresh[p].tobytes() == first[p].tobytes() == second[p].tobytes()
    assert set(fresh_err) == set(first_err) == set(second_err) == {"bad.wav"}
    other = CountingEmbedder(tag="other weights")
    embed_files(paths, other, tmp_path, cache_dir=cache)
    assert other.calls == 2  # another embedder identity is another key


def test_embed_files_on_worker_processes_equals_one_process(tmp_path, espeak_voices, monkeypatch):
    """Resemblyzer on the CPU: the files spread over two forked workers give the same
    float64 embeddings, bit for bit, and the same exclusions, as one process; and the
    embedder ran PyTorch on one thread, whatever the process had set."""
    import torch

    from voicebias import parallel
    from voicebias.audio import write_audio
    from voicebias.instruments import embeddings as E

    sigs, sr = espeak_voices
    paths = []
    for i, ((voice, key), x) in enumerate(sigs.items()):
        for j, part in enumerate((x, x[: len(x) // 2])):
            write_audio(tmp_path / f"u{i}-{j}.flac", part, sr)
            paths.append(f"u{i}-{j}.flac")
    write_audio(tmp_path / "silent.flac", np.zeros(16000, dtype=np.float32), 16000)
    (tmp_path / "broken.flac").write_bytes(b"not audio")
    paths += ["silent.flac", "broken.flac"]
    emb = E.get_embedder("resemblyzer")
    assert emb.identity()["torch_threads"] == 1
    seen = []
    original = emb._embed16k
    monkeypatch.setattr(emb, "_embed16k", lambda x: (seen.append(torch.get_num_threads()), original(x))[1])
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(parallel, "cores", lambda: 1)
        one, one_err = E.embed_files(paths, emb, root=tmp_path)
        monkeypatch.setattr(parallel, "cores", lambda: 2)
        two, two_err = E.embed_files(paths, emb, root=tmp_path)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(2)
    assert seen and set(seen) == {1}
    assert one.keys() == two.keys() and len(one) == 12
    for p in one:
        assert np.array_equal(one[p], two[p])
    assert set(one_err) == set(two_err) == {"silent.flac", "broken.flac"}


_EMBED_ONE = textwrap.dedent("""
    import sys
    import numpy as np
    from voicebias.instruments.embeddings import get_embedder
    from voicebias.tts import get_backend
    x, sr = get_backend("espeak", rate_wpm=160).synthesize(sys.argv[1], "en-us+f3")
    emb = get_embedder("resemblyzer")
    np.save(sys.argv[2], emb.embed(x, sr))
    print(emb.identity()["mkl_cbwr"])
""")


def test_resemblyzer_embedding_is_the_same_on_avx2_and_avx512_code_paths(tmp_path):
    """The same bytes on every x86-64 machine: on an AVX-512 CPU, a process that keeps
    oneDNN, PyTorch's own kernels, NumPy and OpenBLAS to their AVX2 code, as on an
    AVX2-only machine, embeds bit for bit alike. MKL picks no path by instruction set:
    voicebias puts it in its reproducible mode (MKL_CBWR), which the embedder records."""
    import os
    import subprocess
    import sys

    from tests.support.isa import AVX2_CODE_PATHS as avx2
    from tests.support.isa import NATIVE, require_avx512

    require_avx512()
    base = {**{k: v for k, v in os.environ.items() if k not in avx2 and k != "MKL_CBWR"}, **NATIVE}
    script = tmp_path / "embed_one.py"
    script.write_text(_EMBED_ONE)
    out = {}
    for name, env in (("native", base), ("avx2", {**base, **avx2})):
        out[name] = tmp_path / f"{name}.npy"
        done = subprocess.run(
            [sys.executable, str(script), TEXT_A, str(out[name])],
            env=env,
            check=True,
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
        )
        assert done.stdout.split()[-1] == "COMPATIBLE"
    native, emulated = np.load(out["native"]), np.load(out["avx2"])
    assert native.shape == (256,) and np.isfinite(native).all()
    assert native.tobytes() == emulated.tobytes()
