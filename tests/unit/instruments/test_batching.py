"""Batched inference of the paper profile's neural instruments, on tiny models built here.

What users rely on: with `batch_size` > 1 (the GPU default) every clip gets the output
it gets alone (wav2vec2 margins, ECAPA embeddings, Whisper tokens), within 1e-5, and in
input order; the padding of a batch is kept out of each clip's result by the attention
mask (wav2vec2), by the relative lengths and the mirrored frames past each clip's end
(ECAPA), or does not arise (Whisper pads every clip to 30 s on its own).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch

from tests.fakes.tiny_models import build_tiny_whisper
from tests.support.instruments import build_ecapa_folder
from voicebias.instruments.asr import WhisperASR
from voicebias.instruments.classifiers import Wav2Vec2GenderClassifier
from voicebias.instruments.embeddings import embed_files, get_embedder

SR = 16000
TOL = 1e-5


def signals(seconds=(0.6, 1.1, 1.7), seed=0):
    """Sine plus noise, one clip per duration, each its own pitch (seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in seconds:
        t = np.arange(int(d * SR)) / SR
        f = rng.uniform(100, 260)
        out.append((0.3 * np.sin(2 * np.pi * f * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32))
    return out


# not sorted by length, so a batch sorted by length has to be put back in order
DURATIONS = (1.1, 0.6, 1.7, 0.9)


# ------------------------------------------------------------------ wav2vec2 classifiers


def tiny_w2v2(folder, layer_norm=True, extractor_mask=True, seed=0):
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    torch.manual_seed(seed)
    cfg = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(8, 8),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
        num_labels=2,
        initializer_range=0.2,  # logits of order 1 (the default 0.02 gives ~1e-3)
        feat_extract_norm="layer" if layer_norm else "group",
        do_stable_layer_norm=layer_norm,
        id2label={0: "female", 1: "male"},
        label2id={"female": 0, "male": 1},
    )
    Wav2Vec2ForSequenceClassification(cfg).eval().save_pretrained(folder)
    Wav2Vec2FeatureExtractor(sampling_rate=SR, return_attention_mask=extractor_mask, do_normalize=True).save_pretrained(
        folder
    )
    return folder


def one_at_a_time_logits(folder, audio):
    single = Wav2Vec2GenderClassifier(folder, name="tiny", batch_size=1, device="cpu")
    return np.concatenate([single.logits([a]) for a in audio])


@pytest.mark.parametrize("extractor_mask", [True, False])
def test_layer_norm_wav2vec2_padded_batches_equal_one_at_a_time(tmp_path, extractor_mask):
    """Also when the checkpoint's preprocessor_config leaves the mask off: a layer-norm
    encoder is batched with the mask all the same."""
    folder = tiny_w2v2(tmp_path / "w2v2", extractor_mask=extractor_mask, seed=1)
    audio = signals(DURATIONS)
    clf = Wav2Vec2GenderClassifier(folder, name="tiny", batch_size=3, device="cpu")
    assert clf.masked_batches
    batched = clf.logits(audio)
    single = one_at_a_time_logits(folder, audio)
    assert np.abs(batched - single).max() < TOL
    assert np.ptp(single[:, 0] - single[:, 1]) > 0.05  # the clips do score differently, so order is visible
    # input order is kept: reversed input, reversed output
    np.testing.assert_allclose(clf.logits(audio[::-1]), batched[::-1], rtol=0, atol=TOL)
    m = clf.margins(pd.DataFrame(index=range(len(audio))), audio=audio)
    np.testing.assert_allclose(m, single[:, 0] - single[:, 1], rtol=0, atol=2 * TOL)


def test_padding_would_change_wav2vec2_outputs_without_the_mask(tmp_path):
    """Why the mask matters: the same padded batch, fed without it, moves the short clips."""
    from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    folder = tiny_w2v2(tmp_path / "w2v2", seed=1)
    audio = signals()
    fe = Wav2Vec2FeatureExtractor.from_pretrained(folder)
    model = Wav2Vec2ForSequenceClassification.from_pretrained(folder).eval()
    feats = fe(audio, sampling_rate=SR, padding=True, return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        unmasked = model(input_values=feats["input_values"]).logits.numpy()
    single = one_at_a_time_logits(folder, audio)
    assert np.abs(unmasked[:2] - single[:2]).max() > 1e-3


def test_group_norm_wav2vec2_is_batched_only_at_equal_lengths(tmp_path):
    """A group-norm encoder normalises over the padded length, mask or not: its clips are
    batched with clips of the same length only, and still score as they do alone."""
    from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    folder = tiny_w2v2(tmp_path / "w2v2", layer_norm=False, extractor_mask=False, seed=2)
    audio = signals(DURATIONS)
    audio += [audio[0][::-1].copy(), audio[2][::-1].copy()]  # two pairs of equal lengths
    clf = Wav2Vec2GenderClassifier(folder, name="tiny", batch_size=4, device="cpu")
    assert not clf.masked_batches
    batched = clf.logits(audio)
    single = one_at_a_time_logits(folder, audio)
    assert np.abs(batched - single).max() < TOL
    # padding does change a group-norm model's output, with the mask too
    fe = Wav2Vec2FeatureExtractor.from_pretrained(folder)
    model = Wav2Vec2ForSequenceClassification.from_pretrained(folder).eval()
    feats = fe(audio[:3], sampling_rate=SR, padding=True, return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        padded = model(**feats).logits.numpy()
    assert np.abs(padded[:2] - single[:2]).max() > 1e-4


# ------------------------------------------------------------------ ECAPA speaker embeddings


@pytest.fixture(scope="module")
def ecapa_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ecapa") / "spkrec-ecapa-voxceleb"
    build_ecapa_folder(folder, seed=0)
    return folder


def ecapa(folder, batch_size, tmp_path):
    return get_embedder("ecapa", weights=folder, savedir=tmp_path / "sb", device="cpu", batch_size=batch_size)


def test_ecapa_padded_batches_equal_one_at_a_time(ecapa_folder, tmp_path):
    audio = signals(DURATIONS)
    single = ecapa(ecapa_folder, 1, tmp_path)
    alone = np.stack([single.embed(x, SR) for x in audio])
    np.testing.assert_array_equal(single.embed_many(audio, SR), alone)  # batch_size 1: the one-clip path
    emb = ecapa(ecapa_folder, 3, tmp_path)
    assert emb._reflect_pads is not None and max(emb._reflect_pads) == 4
    batched = emb.embed_many(audio, SR)
    assert np.abs(batched - alone).max() < TOL
    assert np.abs(alone[0] - alone[1]).max() > 1e-3  # different clips, different embeddings
    np.testing.assert_allclose(emb.embed_many(audio[::-1], SR), batched[::-1], rtol=0, atol=TOL)
    # one rate per signal: a 24 kHz clip is resampled, as alone
    from voicebias.audio import resample

    mixed = emb.embed_many([resample(audio[0], SR, 24000), *audio[1:]], [24000, SR, SR, SR])
    assert np.abs(mixed[0] - single.embed(resample(audio[0], SR, 24000), 24000)).max() < TOL


def test_ecapa_needs_both_the_lengths_and_the_mirrored_frames(ecapa_folder, tmp_path, monkeypatch):
    """Each of the two ingredients is needed: SpeechBrain's own padded batch (relative
    lengths only) and a batch with mirrored frames but no lengths both move the short clips."""
    audio = signals()
    single = ecapa(ecapa_folder, 1, tmp_path)
    alone = np.stack([single.embed(x, SR) for x in audio])
    emb = ecapa(ecapa_folder, 3, tmp_path)
    wavs = torch.zeros(3, len(audio[2]))
    for i, x in enumerate(audio):
        wavs[i, : len(x)] = torch.from_numpy(x)
    with torch.no_grad():
        own = emb.model.encode_batch(wavs, torch.tensor([len(x) / wavs.shape[1] for x in audio])).reshape(3, -1)
    assert np.abs(own.numpy()[:2] - alone[:2]).max() > 1e-3
    model = emb.model.mods.embedding_model
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda x, lengths=None: forward(x, None))
    assert np.abs(emb.embed_many(audio, SR)[:2] - alone[:2]).max() > 1e-3


def test_ecapa_other_networks_batch_equal_lengths_only(ecapa_folder, tmp_path):
    audio = signals(DURATIONS)
    audio.append(audio[1][::-1].copy())
    emb = ecapa(ecapa_folder, 4, tmp_path)
    emb._reflect_pads = None  # what a network without the exact padding gets
    single = ecapa(ecapa_folder, 1, tmp_path)
    alone = np.stack([single.embed(x, SR) for x in audio])
    assert np.abs(emb.embed_many(audio, SR) - alone).max() < TOL


def test_embed_files_excludes_bad_files_and_keeps_the_rest(ecapa_folder, tmp_path):
    audio = signals(DURATIONS)
    for i, x in enumerate(audio):
        sf.write(tmp_path / f"{i}.flac", x, SR)
    (tmp_path / "bad.flac").write_bytes(b"not audio")
    sf.write(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), SR)
    paths = ["0.flac", "bad.flac", "1.flac", "2.flac", "empty.wav", "3.flac", "0.flac"]
    embs, errors = embed_files(paths, ecapa(ecapa_folder, 3, tmp_path), root=tmp_path, chunk=5)
    assert set(errors) == {"bad.flac", "empty.wav"} and set(embs) == {f"{i}.flac" for i in range(4)}
    single = ecapa(ecapa_folder, 1, tmp_path)
    from voicebias.audio import read_audio

    for i in range(4):
        x, sr = read_audio(tmp_path / f"{i}.flac")
        assert np.abs(embs[f"{i}.flac"] - single.embed(x, sr)).max() < TOL


# ------------------------------------------------------------------ Whisper ASR


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    # wide random weights: each clip gets its own tokens and first-step logits
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "whisper-tiny-local", init_std=0.5)


def test_whisper_batches_decode_as_one_at_a_time(whisper_dir):
    audio = signals(DURATIONS)
    langs = ["en", "es", "en", None]
    single = WhisperASR(whisper_dir, max_new_tokens=8, batch_size=1)
    batched = WhisperASR(whisper_dir, max_new_tokens=8, batch_size=3)
    assert batched.cache_id == single.cache_id  # the batch size does not name the transcripts
    alone = [single.token_ids([x], SR, [lang], first_logits=True) for x, lang in zip(audio, langs)]
    ids, logits = batched.token_ids(audio, SR, langs, first_logits=True)
    assert ids == [a[0][0] for a in alone]
    assert np.abs(logits - np.concatenate([a[1] for a in alone])).max() < TOL
    assert np.abs(logits[0] - logits[2]).max() > 0.1 and len({tuple(t) for t in ids}) > 1  # the clips do differ
    texts = batched.transcribe_many(audio, SR, langs)
    assert texts == [single.transcribe(x, SR, language=lang) for x, lang in zip(audio, langs)]
    assert batched.transcribe_many(audio[::-1], SR, langs[::-1]) == texts[::-1]


def test_whisper_batched_rows_end_at_their_own_end_of_text(whisper_dir, monkeypatch):
    """A row that finishes early is filled with the pad token (here = end-of-text) by
    generate: its ids and text stop at its own end-of-text, as when it is decoded alone."""
    asr = WhisperASR(whisper_dir, max_new_tokens=8, batch_size=2)
    eos = asr.model.generation_config.eos_token_id
    start = asr.model.generation_config.decoder_start_token_id
    a, b = (asr.processor.tokenizer.convert_tokens_to_ids(c) for c in "ab")
    rows = torch.tensor([[start, a, eos, eos, eos], [start, a, b, b, eos]])
    monkeypatch.setattr(asr.model, "generate", lambda feats, **kw: rows[: len(feats)])
    assert asr.token_ids(signals((0.6, 1.1)), SR) == [[start, a, eos], [start, a, b, b, eos]]
    assert asr.transcribe_many(signals((0.6, 1.1)), SR) == ["a", "abb"]


def test_runner_transcribes_in_batches(tmp_path, whisper_dir, monkeypatch):
    from tests.fakes.stimuli import make_stimuli
    from tests.support.instruments import Continuer
    from voicebias.systems.runner import ResponseCache, run_task
    from voicebias.tasks import Task

    stim = make_stimuli(tmp_path, 5)
    task = Task("continue", "speech continuation", "same", {})
    one = WhisperASR(whisper_dir, max_new_tokens=6, batch_size=1)
    ref, _ = run_task(
        Continuer(), task, stim, tmp_path / "o1", ResponseCache(tmp_path / "c1"), 1, tmp_path, asr=one, progress=False
    )
    asr = WhisperASR(whisper_dir, max_new_tokens=6, batch_size=2)
    sizes: list[int] = []
    many = asr.transcribe_many
    monkeypatch.setattr(asr, "transcribe_many", lambda a, sr, langs: sizes.append(len(a)) or many(a, sr, langs))
    table, counts = run_task(
        Continuer(), task, stim, tmp_path / "o2", ResponseCache(tmp_path / "c2"), 1, tmp_path, asr=asr, progress=False
    )
    assert sizes == [2, 2, 1] and counts["asr_calls"] == 5
    assert list(table.transcript) == list(ref.transcript)


def test_phonation_gate_similarities_are_the_same_batched(ecapa_folder, tmp_path):
    """The manipulation check's speaker similarities: ECAPA in batches gives the one-at-a-time
    cosines; an unreadable converted file gets its error and no similarity."""
    from voicebias.gates.phonation_check import speaker_similarities

    audio = signals((0.6, 1.1, 1.7, 0.9, 1.3))
    for i, x in enumerate(audio):
        sf.write(tmp_path / f"{i}.flac", x, SR)
    (tmp_path / "bad.flac").write_bytes(b"not audio")
    manifest = pd.DataFrame(
        {
            "stimulus_id": ["m1", "m2", "c1", "c2", "c3", "cbad"],
            "path": ["0.flac", "1.flac", "2.flac", "3.flac", "4.flac", "bad.flac"],
            "phonation": ["modal", "modal", "breathy", "creaky", "breathy", "creaky"],
            "source_stimulus_id": ["m1", "m2", "m1", "m1", "m2", "m2"],
            "prompt_id": "p1",
            "voice_gender": "female",
            "voice_id": ["v1", "v2", "v1", "v1", "v2", "v2"],
        }
    )
    own1, between1 = speaker_similarities(manifest, ecapa(ecapa_folder, 1, tmp_path), tmp_path)
    own3, between3 = speaker_similarities(manifest, ecapa(ecapa_folder, 3, tmp_path), tmp_path)
    np.testing.assert_allclose(own3["speaker_similarity"], own1["speaker_similarity"], rtol=0, atol=TOL)
    np.testing.assert_allclose(between3["between_similarity"], between1["between_similarity"], rtol=0, atol=TOL)
    bad = own3.set_index("stimulus_id").loc["cbad"]
    assert np.isnan(bad["speaker_similarity"]) and "not a readable audio file" in bad["similarity_error"]
    assert own3["speaker_similarity"].notna().sum() == 3 and len(between3) == 2
