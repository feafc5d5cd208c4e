"""Whisper ASR for systems without a text stream, on a tiny Whisper built locally.

What users rely on: outputs without text get a transcript from the configured local
Whisper model (marked as ASR in the table), transcripts are cached per ASR
configuration so re-runs and ASR changes never call the system again, and a
missing folder or an empty tokenizer (the offline-hub trap) fails at once with a
clear message instead of producing empty transcripts.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes.stimuli import make_stimuli
from tests.fakes.tiny_models import build_tiny_whisper
from tests.support.instruments import Continuer
from voicebias.instruments.asr import ASRSetupError, WhisperASR
from voicebias.systems.runner import ResponseCache, run_task, validate_responses
from voicebias.tasks import Task


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "whisper-tiny-local")


def test_outputs_without_text_are_transcribed_and_cached_per_asr(tmp_path, whisper_dir):
    stim = make_stimuli(tmp_path, 3)
    task = Task("continue", "speech continuation", "same", {})
    cache = ResponseCache(tmp_path / "cache")
    system = Continuer()
    asr = WhisperASR(whisper_dir, max_new_tokens=6)
    table, counts = run_task(system, task, stim, tmp_path / "o", cache, 1, tmp_path, asr=asr, progress=False)
    validate_responses(table, kind="continuation")
    assert (table.transcript_source == "asr:whisper-tiny-local").all()
    assert table.transcript.notna().all() and counts["asr_calls"] == 3 and system.calls == 3
    # the transcript is the ASR's reading of the system's own output audio
    from voicebias.audio import read_audio

    x, sr = read_audio(tmp_path / table.output_audio.iloc[0])
    assert table.transcript.iloc[0] == asr.transcribe(x, sr, language="en")
    # re-run: no system call, no ASR call
    _, counts2 = run_task(system, task, stim, tmp_path / "o2", cache, 1, tmp_path, asr=asr, progress=False)
    assert counts2["cache_hits"] == 3 and counts2["asr_calls"] == 0 and system.calls == 3
    # another ASR configuration: transcribed again, still no system call
    other = WhisperASR(whisper_dir, max_new_tokens=3)
    assert other.cache_id != asr.cache_id
    _, counts3 = run_task(system, task, stim, tmp_path / "o3", cache, 1, tmp_path, asr=other, progress=False)
    assert counts3["asr_calls"] == 3 and system.calls == 3
    # without an ASR, a continuation without text stays ok, with no transcript
    table4, _ = run_task(system, task, stim, tmp_path / "o4", cache, 1, tmp_path, progress=False)
    assert (table4.status == "ok").all() and table4.transcript.isna().all()
    assert (table4.transcript_source == "none").all()


def test_missing_or_wrong_folder_fails_fast(tmp_path):
    with pytest.raises(ASRSetupError, match="not found"):
        WhisperASR(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text('{"model_type": "wav2vec2"}')
    with pytest.raises(ASRSetupError, match="not Whisper"):
        WhisperASR(tmp_path / "x")


def test_empty_tokenizer_trap_fails_fast(tmp_path):
    folder = build_tiny_whisper(tmp_path / "broken", with_special_tokens=False)
    with pytest.raises(ASRSetupError, match="empty or incomplete"):
        WhisperASR(folder)


def test_float16_checkpoint_transcribes_on_cpu(tmp_path):
    """whisper-large-v3 declares float16 in its config, and transformers loads it so: the
    float32 features must be cast to the model's dtype or the first conv layer refuses them."""
    import json

    import torch

    folder = build_tiny_whisper(tmp_path / "whisper-fp16", dtype="float16")
    assert json.loads((folder / "config.json").read_text()).get("dtype") == "float16"
    asr = WhisperASR(folder, max_new_tokens=4)
    assert asr.model.dtype == torch.float16
    t = np.arange(16000) / 16000
    text = asr.transcribe((0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 16000, language="en")
    assert isinstance(text, str)
    # transformers itself, fed features cast by hand, gives the same text
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    proc = WhisperProcessor.from_pretrained(folder)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    feats = proc(
        (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), sampling_rate=16000, return_tensors="pt"
    ).input_features.to(torch.float16)
    with torch.no_grad():
        ids = model.generate(feats, max_new_tokens=4, num_beams=1, do_sample=False, language="en", task="transcribe")
    assert proc.batch_decode(ids, skip_special_tokens=True)[0].strip() == text
