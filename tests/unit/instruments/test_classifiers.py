"""Speaker-gender classifiers: the wav2vec2 backend on tiny checkpoints built here,
through the real local loading and batched inference path, and the acoustic-norms default."""

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch
from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

from voicebias.errors import ConfigError
from voicebias.instruments.acoustics import add_margins
from voicebias.instruments.classifiers import (
    Wav2Vec2GenderClassifier,
    get_classifier,
    label_indices,
)

SR = 16000


def tiny_checkpoint(folder, id2label, layer_norm=True, seed=0):
    """A randomly initialised two-layer wav2vec2 sequence classifier saved like a hub download."""
    torch.manual_seed(seed)
    cfg = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(16, 16, 16),
        conv_stride=(5, 4, 4),
        conv_kernel=(10, 8, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
        feat_extract_norm="layer" if layer_norm else "group",
        do_stable_layer_norm=layer_norm,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    Wav2Vec2ForSequenceClassification(cfg).eval().save_pretrained(folder)
    Wav2Vec2FeatureExtractor(sampling_rate=SR, return_attention_mask=layer_norm, do_normalize=True).save_pretrained(
        folder
    )
    return folder


def clips(n=5, seed=1):
    rng = np.random.default_rng(seed)
    t = lambda d: np.arange(int(d * SR)) / SR  # noqa: E731
    return [
        (0.3 * np.sin(2 * np.pi * f * t(d)) + 0.05 * rng.standard_normal(int(d * SR))).astype(np.float32)
        for f, d in zip(rng.uniform(90, 250, n), rng.uniform(0.4, 1.3, n))
    ]


def direct_logits(folder, clip):
    """Logits from transformers itself, one clip, no voicebias code in the path."""
    fe = Wav2Vec2FeatureExtractor.from_pretrained(folder)
    model = Wav2Vec2ForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**fe(clip, sampling_rate=SR, return_tensors="pt")).logits[0].numpy()


@pytest.fixture(scope="module")
def male_first(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("w2v2") / "ckpt", {0: "male", 1: "female"})


def test_margin_is_female_minus_male_logit_found_from_the_label_map(male_first):
    clf = Wav2Vec2GenderClassifier(male_first, name="tiny")
    assert (clf.female_index, clf.male_index) == (1, 0)
    audio = clips(3)
    margins = clf.margins(pd.DataFrame(index=range(3)), audio=audio)
    for clip, m in zip(audio, margins):
        z = direct_logits(male_first, clip)
        assert m == pytest.approx(z[1] - z[0], abs=1e-5)
        # sign consistency: positive margin exactly when the argmax is 'female'
        assert (m > 0) == (int(np.argmax(z)) == 1)


@pytest.mark.parametrize("layer_norm", [True, False])
def test_batched_inference_equals_one_by_one(tmp_path, layer_norm):
    folder = tiny_checkpoint(tmp_path / "ckpt", {0: "female", 1: "male"}, layer_norm=layer_norm, seed=3)
    audio = clips(7, seed=2)
    audio.append(audio[0][: len(audio[1])].copy())  # two clips of one length share a group-norm batch
    batched = Wav2Vec2GenderClassifier(folder, batch_size=4).margins(pd.DataFrame(index=range(8)), audio=audio)
    single = Wav2Vec2GenderClassifier(folder, batch_size=1)
    one_by_one = [single.margins(pd.DataFrame(index=[0]), audio=[a])[0] for a in audio]
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)
    assert np.ptp(batched) > 1e-3  # the clips do get different margins


def test_audio_at_another_rate_is_resampled_to_16k(male_first):
    clf = Wav2Vec2GenderClassifier(male_first)
    clip = clips(1)[0]
    from voicebias.audio import resample

    m48 = clf.margins(pd.DataFrame(index=[0]), audio=[resample(clip, SR, 48000)], sample_rate=48000)[0]
    m16 = clf.margins(pd.DataFrame(index=[0]), audio=[clip])[0]
    assert m48 == pytest.approx(m16, abs=0.05)


def test_label_map_is_asserted():
    assert label_indices({0: "Female", 1: "MALE"}) == (0, 1)
    with pytest.raises(ValueError, match="cannot tell female from male"):
        label_indices({0: "LABEL_0", 1: "LABEL_1"})
    assert label_indices({0: "LABEL_0", 1: "LABEL_1"}, {"female": 0, "male": 1}) == (0, 1)
    with pytest.raises(ValueError, match="label map mismatch"):
        label_indices({0: "male", 1: "female"}, {"female": 0, "male": 1})
    with pytest.raises(ValueError, match="two-class"):
        label_indices({0: "female", 1: "male", 2: "child"})


def test_generic_labels_need_a_stated_order(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", {0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(ValueError, match="cannot tell female from male"):
        Wav2Vec2GenderClassifier(folder)
    clf = Wav2Vec2GenderClassifier(folder, labels={"female": 0, "male": 1})
    z = clf.logits(clips(1))
    assert clf.margins(pd.DataFrame(index=[0]), audio=clips(1))[0] == pytest.approx(z[0, 0] - z[0, 1], abs=1e-6)


def test_missing_weights_fail_fast_with_a_clear_message(tmp_path, monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("a missing weights folder must not reach for the hub")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(FileNotFoundError, match="weights folder .*missing-folder not found.*alefiury"):
        get_classifier("w2v2_librispeech", weights=tmp_path / "missing-folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        get_classifier("w2v2_commonvoice", weights=empty)
    with pytest.raises(ValueError, match="acoustics.classifier_weights.w2v2_commonvoice"):
        get_classifier("w2v2_commonvoice")
    with pytest.raises(KeyError, match="unknown classifier"):
        get_classifier("nope")


def test_pipeline_reads_classifier_weights_from_params(tmp_path, male_first):
    """The acoustics stage's margin step: the weights folder comes from params, relative to the root."""
    root = tmp_path / "proj"
    (root / "audio").mkdir(parents=True)
    audio = clips(3, seed=5)
    for i, a in enumerate(audio):
        sf.write(root / "audio" / f"{i}.flac", a, SR)
    import shutil

    shutil.copytree(male_first, root / "models" / "tiny")
    df = pd.DataFrame(
        {
            "path": [f"audio/{i}.flac" for i in range(3)],
            "status": ["ok", "excluded", "ok"],
            "f0_median_st": [3.0, np.nan, 12.0],
            "formant_index": [0.0, np.nan, 0.25],
            "f3_hz": [2450.0, np.nan, 2900.0],
            "vtl_index": [0.0, np.nan, 0.2],
        }
    )
    params = {
        "classifier": ["acoustic_norms", "w2v2_librispeech"],
        "classifier_weights": {"w2v2_librispeech": "models/tiny"},
    }
    out = add_margins(df.copy(), params, root)
    clf = Wav2Vec2GenderClassifier(male_first)
    from voicebias.audio import read_audio

    expected = clf.margins(df.iloc[[0, 2]], audio=[read_audio(root / "audio" / f"{i}.flac")[0] for i in (0, 2)])
    np.testing.assert_allclose(out["margin_w2v2_librispeech"].to_numpy()[[0, 2]], expected, atol=1e-5)
    assert np.isnan(out.loc[1, "margin_w2v2_librispeech"])  # excluded files get no margin
    assert out.loc[0, "margin_acoustic_norms"] < 0 < out.loc[2, "margin_acoustic_norms"]


def test_composite_takes_several_classifiers_with_equal_weights():
    from voicebias.instruments.composite import composite_measures, femininity_composite, reference_stats

    measures = composite_measures(["a", "b"], "vtl_index")
    assert measures == ["f0_median_st", "vtl_index", "margin_a", "margin_b"]
    assert composite_measures("a", "formant_index") == ["f0_median_st", "formant_index", "margin_a"]
    with pytest.raises(ConfigError, match="unknown formant term 'f2_hz': choose one of formant_index, vtl_index"):
        composite_measures("a", "f2_hz")
    rng = np.random.default_rng(0)
    inputs = pd.DataFrame({m: rng.normal(i, i + 1, 40) for i, m in enumerate(measures)})
    inputs = inputs.assign(lang=["en"] * 20 + ["es"] * 20, status="ok")
    ref = reference_stats(inputs, measures)
    assert len(ref) == 8 and (ref["n"] == 20).all()
    en = inputs[inputs["lang"] == "en"]
    assert ref.set_index(["lang", "measure"]).loc[("en", "margin_b"), "sd"] == pytest.approx(en["margin_b"].std(ddof=1))
    # an output one reference SD above the mean on every measure scores exactly +1;
    # one SD above on a single measure of four scores +1/4
    R = ref.set_index(["lang", "measure"])
    up = {m: R.loc[("es", m), "mean"] + R.loc[("es", m), "sd"] for m in measures}
    one = {
        **up,
        "f0_median_st": R.loc[("es", "f0_median_st"), "mean"],
        "margin_a": R.loc[("es", "margin_a"), "mean"],
        "margin_b": R.loc[("es", "margin_b"), "mean"],
    }
    out = pd.DataFrame([up, one]).assign(lang="es")
    np.testing.assert_allclose(femininity_composite(out, ref, measures), [1.0, 0.25])
    # inputs standardised against themselves average to 0 per language
    assert femininity_composite(inputs, ref, measures).groupby(inputs["lang"]).mean().abs().max() < 1e-12
    with pytest.raises(KeyError, match="no composite reference for language.*zh"):
        femininity_composite(out.assign(lang="zh"), ref, measures)


def test_float16_checkpoint_scores_on_cpu(tmp_path):
    """A checkpoint whose config declares float16 loads in float16: the float32 features are
    cast to the model's dtype, and the margins match transformers fed float16 features by hand."""
    folder = tiny_checkpoint(tmp_path / "fp16", {0: "female", 1: "male"})
    Wav2Vec2ForSequenceClassification.from_pretrained(folder).to(torch.float16).save_pretrained(folder)
    clf = Wav2Vec2GenderClassifier(folder, name="tiny16", device="cpu")
    assert clf.model.dtype == torch.float16
    audio = clips(2)
    logits = clf.logits(audio)
    fe = Wav2Vec2FeatureExtractor.from_pretrained(folder)
    model = Wav2Vec2ForSequenceClassification.from_pretrained(folder).eval()
    for clip, row in zip(audio, logits):
        feats = fe(clip, sampling_rate=SR, return_tensors="pt")
        with torch.no_grad():
            want = (
                model(input_values=feats["input_values"].to(torch.float16), attention_mask=feats["attention_mask"])
                .logits[0]
                .float()
                .numpy()
            )
        np.testing.assert_allclose(row, want, rtol=0, atol=2e-3)
