"""Fake repository checkouts: the same importable names as the real repositories, tiny behaviour.

They stand in for a user's checkout at the import boundary, so the shipped drivers
(voicebias/systems/drivers/) and the subprocess machinery run for real. The fake
model answers with a tone and the text "heard <n> samples; prompt: <prompt>", and
misbehaves on purpose for inputs whose prompt says so: "CRASH" kills the process,
"HANG" sleeps, "RAISE" raises.
"""

from __future__ import annotations

from pathlib import Path

KIMI = """
import os, time
import numpy as np
import soundfile as sf

class KimiAudio:
    def __init__(self, model_path, load_detokenizer=True):
        if not os.path.isdir(model_path):
            raise FileNotFoundError(model_path)
        if os.environ.get("FAKE_KIMI_FAIL_LOAD"):
            raise ImportError("No module named 'flash_attn'")
        print("loading fake Kimi-Audio")  # repository chatter must not break the protocol

    def generate(self, messages, output_type="both", **sampling):
        assert output_type == "both" and sampling["audio_top_k"] == 10
        prompt = [m["content"] for m in messages if m["message_type"] == "text"][0]
        audio, sr = sf.read([m["content"] for m in messages if m["message_type"] == "audio"][0])
        assert sr == 16000
        if "CRASH" in prompt:
            os._exit(3)
        if "HANG" in prompt:
            time.sleep(30)
        if "RAISE" in prompt:
            raise ValueError("input too long for the audio tokenizer")
        t = np.arange(12000) / 24000
        return np.sin(2 * np.pi * 220 * t).astype(np.float32) * 0.3, f"heard {len(audio)} samples; prompt: {prompt}"
"""


CONTINUE_SCRIPT = """
import sys
import numpy as np
import soundfile as sf
audio, out, text_out, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
x, sr = sf.read(audio)
sf.write(out, np.tile(x, int(np.ceil(seconds * sr / len(x))))[: int(seconds * sr)], sr)
if text_out != "-":
    open(text_out, "w").write("and then she went home")
"""


def command_checkout(folder: Path) -> Path:
    """A checkout with an inference script continuing the prompt by repeating it."""
    folder.mkdir(parents=True)
    (folder / "continue.py").write_text(CONTINUE_SCRIPT)
    return folder


ARGV_SCRIPT = """
import os
import sys
import numpy as np
import soundfile as sf
# the words after the output path, as the bytes this process received, NUL-separated
with open("received.bin", "wb") as fh:
    fh.write(b"\\0".join(os.fsencode(a) for a in sys.argv[2:]))
sf.write(sys.argv[1], (0.2 * np.sin(2 * np.pi * 150 * np.arange(1600) / 16000)).astype(np.float32), 16000)
"""


def argv_checkout(folder: Path) -> Path:
    """Add record_argv.py to a checkout: it writes a tone to its first argument and the
    bytes of every further argument it received to received.bin in its working directory."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "record_argv.py").write_text(ARGV_SCRIPT)
    return folder


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _tone_wav(path: Path, seconds: float, sr: int) -> None:
    import numpy as np
    import soundfile as sf

    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * sr)) / sr
    sf.write(str(path), (0.2 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sr)


# --- Kimi-Audio: kimia_infer/api/{kimia,prompt_manager}.py; the prompt manager loads the
# GLM-4-Voice speech tokenizer by its hub id, which resolves to a folder of that name
# under the working directory (the checkout) before the hub is asked.
KIMI_PROMPT_MANAGER = """
import os

class KimiAPromptManager:
    def __init__(self, model_path, kimia_token_offset):
        tokenizer = "THUDM/glm-4-voice-tokenizer"
        if not os.path.isfile(os.path.join(tokenizer, "config.json")):
            if os.environ.get("HF_HUB_OFFLINE") == "1":
                raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {tokenizer} (offline mode)")
            raise RuntimeError("the fake checkout would download " + tokenizer)
        if not os.path.isdir(os.path.join(model_path, "whisper-large-v3")):
            raise FileNotFoundError(os.path.join(model_path, "whisper-large-v3"))
        self.kimia_token_offset = kimia_token_offset
"""

KIMI_TOKENIZER_SUBMODULE = {
    "kimia_infer/models/tokenizer/glm4/speech_tokenizer/__init__.py": "",
    "kimia_infer/models/tokenizer/glm4/speech_tokenizer/modeling_whisper.py": "class WhisperVQEncoder:\n    pass\n",
}


def kimi_checkout(folder: Path, speech_tokenizer: bool = True, submodule: bool = True) -> Path:
    """A checkout exposing kimia_infer.api.kimia.KimiAudio (and its prompt manager).

    `speech_tokenizer`: put THUDM/glm-4-voice-tokenizer in the checkout, where the
    prompt manager's hub id resolves offline; `submodule`: the GLM-4-Voice submodule
    under kimia_infer/models/tokenizer/glm4 is checked out."""
    files = {
        "kimia_infer/__init__.py": "",
        "kimia_infer/api/__init__.py": "",
        "kimia_infer/api/kimia.py": KIMI.replace(
            '        print("loading fake Kimi-Audio")',
            "        from .prompt_manager import KimiAPromptManager\n"
            "        self.prompt_manager = KimiAPromptManager(model_path=model_path, kimia_token_offset=152064)\n"
            '        print("loading fake Kimi-Audio")',
        ),
        "kimia_infer/api/prompt_manager.py": KIMI_PROMPT_MANAGER,
        "kimia_infer/models/__init__.py": "",
        "kimia_infer/models/tokenizer/__init__.py": "",
    }
    if submodule:
        files.update(KIMI_TOKENIZER_SUBMODULE)
    if speech_tokenizer:
        files["THUDM/glm-4-voice-tokenizer/config.json"] = '{"model_type": "whisper"}'
    (folder / "kimia_infer" / "models" / "tokenizer" / "glm4").mkdir(parents=True, exist_ok=True)
    return _write(folder, files)


def kimi_weights(folder: Path) -> Path:
    """Kimi-Audio-7B-Instruct's layout: the model folder holds whisper-large-v3/."""
    (folder / "whisper-large-v3").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "kimi_audio"}')
    return folder


# --- SpiritLM: spiritlm/model/spiritlm_model.py (Spiritlm, ContentType, OutputModality,
# GenerationInput, GenerationOuput); weights under $SPIRITLM_CHECKPOINTS_DIR/spiritlm_model/<variant>.
SPIRITLM_MODEL = """
import os
from dataclasses import dataclass
from enum import Enum, auto
from pathlib import Path

import numpy as np
import soundfile as sf

base_checkpoints_dir = Path(os.getenv("SPIRITLM_CHECKPOINTS_DIR", Path(__file__).parent.parent.parent / "checkpoints"))
CHECKPOINT_DIR = base_checkpoints_dir / "spiritlm_model"

# token rates of the speech tokenizer: HuBERT units, and for the expressive model also
# pitch and style units, interleaved in one stream
HUBERT_RATE, PITCH_RATE, STYLE_RATE = 24.99, 12.5, 1.0


class ContentType(Enum):
    TEXT = "TEXT"
    SPEECH = "SPEECH"


class OutputModality(Enum):
    TEXT = auto()
    SPEECH = auto()
    ARBITRARY = auto()


@dataclass
class GenerationInput:
    content: object
    content_type: ContentType


@dataclass
class GenerationOuput:
    content: object
    content_type: ContentType


class Spiritlm:
    def __init__(self, name, **speech_tokenizer_kwargs):
        assert name in ("spirit-lm-base-7b", "spirit-lm-expressive-7b"), f"Unknown model name {name}"
        path = CHECKPOINT_DIR / name
        if not path.is_dir():
            raise OSError(f"no checkpoint at {path}")
        self.is_expressive_model = name == "spirit-lm-expressive-7b"

    def generate(self, interleaved_inputs=None, prompt=None, output_modality=OutputModality.ARBITRARY,
                 generation_config=None, force_tokens_to_output_modality=True, speaker_id=2,
                 return_prompt=False, seed=None, **kwargs):
        (inp,) = interleaved_inputs
        assert isinstance(inp, GenerationInput) and inp.content_type == ContentType.SPEECH
        x, sr = sf.read(inp.content)
        assert sr == 16000
        rate = HUBERT_RATE + (PITCH_RATE + STYLE_RATE if self.is_expressive_model else 0.0)
        seconds = generation_config.max_new_tokens / rate
        t = np.arange(int(round(seconds * 16000))) / 16000
        out = [GenerationOuput(np.sin(2 * np.pi * 150 * t).astype(np.float32) * 0.3, ContentType.SPEECH)]
        if output_modality == OutputModality.ARBITRARY:
            out.append(GenerationOuput(" and then she left", ContentType.TEXT))
        return out
"""


def spiritlm_checkout(folder: Path) -> Path:
    """A checkout laid out like facebookresearch/spiritlm (the spiritlm package)."""
    return _write(
        folder,
        {
            "spiritlm/__init__.py": "",
            "spiritlm/model/__init__.py": "",
            "spiritlm/model/spiritlm_model.py": SPIRITLM_MODEL,
        },
    )


def spiritlm_weights(folder: Path) -> Path:
    """SPIRITLM_CHECKPOINTS_DIR's layout: spiritlm_model/<variant>/ and speech_tokenizer/."""
    for sub in ("spiritlm_model/spirit-lm-base-7b", "spiritlm_model/spirit-lm-expressive-7b", "speech_tokenizer"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return folder


# --- GLM-4-Voice: speech_tokenizer/{modeling_whisper,utils}.py, flow_inference.py whose decoder
# builds cosyvoice's flow, which imports matcha from the third_party/Matcha-TTS submodule.
GLM_FILES = {
    "speech_tokenizer/__init__.py": "",
    "speech_tokenizer/modeling_whisper.py": """
import os

class WhisperVQEncoder:
    @classmethod
    def from_pretrained(cls, path):
        if not os.path.isdir(path):
            raise OSError(path)
        return cls()

    def eval(self):
        return self

    def to(self, device):
        return self
""",
    "speech_tokenizer/utils.py": """
import soundfile as sf

def extract_speech_token(model, feature_extractor, utts):
    out = []
    for utt in utts:
        x, sr = sf.read(utt)
        out.append([int(i % 7) for i in range(max(1, int(len(x) / sr * 12.5)))])
    return out
""",
    "flow_inference.py": """
import os

import torch


class AudioDecoder:
    def __init__(self, config_path, flow_ckpt_path, hift_ckpt_path, device="cuda"):
        for p in (config_path, flow_ckpt_path, hift_ckpt_path):
            if not os.path.exists(p):
                raise FileNotFoundError(p)
        from cosyvoice.flow.flow_matching import ConditionalCFM  # what the config instantiates
        self.flow = ConditionalCFM()
        self.device = device

    def token2wav(self, token, uuid, prompt_token=None, prompt_feat=None, embedding=None, finalize=False):
        n = token.shape[1]
        samples = int(n / 12.5 * 22050)
        t = torch.arange(samples) / 22050
        return (0.3 * torch.sin(2 * torch.pi * 180 * t)).unsqueeze(0), torch.zeros(1, 80, n)
""",
    "cosyvoice/__init__.py": "",
    "cosyvoice/flow/flow_matching.py": """
from matcha.models.components.flow_matching import BASECFM


class ConditionalCFM(BASECFM):
    pass
""",
}

MATCHA_FILES = {
    "third_party/Matcha-TTS/matcha/__init__.py": "",
    "third_party/Matcha-TTS/matcha/models/__init__.py": "",
    "third_party/Matcha-TTS/matcha/models/components/__init__.py": "",
    "third_party/Matcha-TTS/matcha/models/components/flow_matching.py": "class BASECFM:\n    pass\n",
}


def glm4_voice_checkout(folder: Path, submodule: bool = True) -> Path:
    """A checkout laid out like THUDM/GLM-4-Voice; without `submodule`, third_party/Matcha-TTS
    is the empty folder a clone without --recurse-submodules leaves."""
    (folder / "third_party" / "Matcha-TTS").mkdir(parents=True, exist_ok=True)
    return _write(folder, {**GLM_FILES, **(MATCHA_FILES if submodule else {})})


GLM_MODEL_CODE = '''
import torch
from transformers import LlamaForCausalLM


class FakeGLMForCausalLM(LlamaForCausalLM):
    """A tiny causal LM whose logits favour audio tokens, so every reply is speech."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        bias = torch.zeros(out.logits.shape[-1], dtype=out.logits.dtype, device=out.logits.device)
        bias[self.config.audio_offset:] = 50.0
        out.logits = out.logits + bias
        return out
'''

GLM_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_audio|>", "<|end_of_audio|>"]


def glm4_voice_weights(folder: Path, n_audio: int = 16) -> Path:
    """The three GLM-4-Voice checkpoints: glm-4-voice-9b (a tiny remote-code causal LM with
    <|audio_N|> tokens), glm-4-voice-tokenizer (a Whisper feature extractor) and
    glm-4-voice-decoder (config.yaml, flow.pt, hift.pt)."""
    import json

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast, WhisperFeatureExtractor

    words = ["<pad>", "<eos>", "<unk>", "streaming_transcription", "hello"]
    audio = [f"<|audio_{i}|>" for i in range(n_audio)]
    vocab = {w: i for i, w in enumerate(words + GLM_SPECIALS + audio)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": GLM_SPECIALS + audio})
    lm_dir = folder / "glm-4-voice-9b"
    lm_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(lm_dir)
    (lm_dir / "modeling_fakeglm.py").write_text(GLM_MODEL_CODE)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(cfg).save_pretrained(lm_dir)
    conf = json.loads((lm_dir / "config.json").read_text())
    conf.update(
        audio_offset=vocab["<|audio_0|>"],
        architectures=["FakeGLMForCausalLM"],
        auto_map={"AutoModel": "modeling_fakeglm.FakeGLMForCausalLM"},
    )
    (lm_dir / "config.json").write_text(json.dumps(conf))
    WhisperFeatureExtractor(feature_size=128).save_pretrained(folder / "glm-4-voice-tokenizer")
    dec = folder / "glm-4-voice-decoder"
    dec.mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "flow.pt", "hift.pt"):
        (dec / name).write_text("fake")
    return folder


# --- Step-Audio-2: stepaudio2.py (StepAudio2) and token2wav.py (Token2wav) at the checkout root.
STEP_FILES = {
    "stepaudio2.py": """
import json
import os

import soundfile as sf


class StepAudio2:
    def __init__(self, model_path):
        if not os.path.isdir(model_path):
            raise OSError(model_path)

    def __call__(self, messages, **kwargs):
        system, human, assistant = messages
        assert system["role"] == "system" and human["role"] == "human"
        assert assistant == {"role": "assistant", "content": "<tts_start>", "eot": False}
        (item,) = human["content"]
        x, sr = sf.read(item["audio"])
        # the reply echoes the generation settings; two token ids beyond the audio vocabulary
        audio_tokens = [i % 6561 for i in range(50)] + [6561, 7000]
        return [], json.dumps(kwargs, sort_keys=True), audio_tokens
""",
    "token2wav.py": """
import io
import os

import numpy as np
import soundfile as sf


class Token2wav:
    def __init__(self, model_path, float16=False):
        if not os.path.isdir(model_path):
            raise OSError(model_path)

    def __call__(self, generated_speech_tokens, prompt_wav):
        assert all(0 <= t < 6561 for t in generated_speech_tokens)
        sf.info(prompt_wav)  # the prompt wav is read relative to the checkout
        n = int(len(generated_speech_tokens) / 25 * 24000)
        buf = io.BytesIO()
        sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * np.arange(n) / 24000)).astype(np.float32), 24000,
                 format="WAV")
        return buf.getvalue()
""",
}


def step_audio2_checkout(folder: Path) -> Path:
    """A checkout laid out like stepfun-ai/Step-Audio2 (with assets/default_female.wav)."""
    _write(folder, STEP_FILES)
    _tone_wav(folder / "assets" / "default_female.wav", 0.5, 16000)
    return folder


def step_audio2_weights(folder: Path) -> Path:
    (folder / "token2wav").mkdir(parents=True, exist_ok=True)
    return folder


# --- SpeechGPT: speechgpt/src/infer/cli_infer.py (SpeechGPTInference); no __init__ files, as upstream.
SPEECHGPT_INFER = """
import json
import os

import numpy as np
import soundfile as sf
import torch

DEFAULT_GEN_PARAMS = {"max_new_tokens": 1024}


class SpeechGPTInference:
    def __init__(self, model_name_or_path, lora_weights=None, s2u_dir="speechgpt/utils/speech2unit/",
                 vocoder_dir="speechgpt/utils/vocoder/", output_dir="speechgpt/output/"):
        for p in (os.path.join(s2u_dir, "mhubert_base_vp_en_es_fr_it3.pt"),
                  os.path.join(s2u_dir, "mhubert_base_vp_en_es_fr_it3_L11_km1000.bin"),
                  os.path.join(vocoder_dir, "vocoder.pt"), os.path.join(vocoder_dir, "config.json"),
                  model_name_or_path):
            if not os.path.exists(p):
                raise FileNotFoundError(p)
        if torch.__version__ >= "2" and sys.platform != "win32":  # upstream uses sys without importing it
            pass
        self.lora_weights = lora_weights
        self.output_dir = output_dir

    def forward(self, prompts):
        (prompt,) = prompts
        path = prompt.split("is input:")[-1].strip()
        x, sr = sf.read(path)
        n = 2 * len(x)
        wav = (0.3 * np.sin(2 * np.pi * 240 * np.arange(n) / 16000)).astype(np.float32)
        os.makedirs(f"{self.output_dir}/wav/", exist_ok=True)
        with open(f"{self.output_dir}/responses.json", "a") as f:
            f.write(json.dumps({"question": prompt, "answer": "<sosp><1><2><eosp>", "textQuestion": "",
                                "textAnswer": "she kept on talking", "unitAnswer": "<1><2>"}) + "\\n")
        return 16000, torch.from_numpy(wav)

    def __call__(self, input):
        return self.forward(input)
"""


def speechgpt_checkout(folder: Path) -> Path:
    """A checkout laid out like 0nutation/SpeechGPT (speechgpt/src/infer/cli_infer.py)."""
    return _write(
        folder,
        {
            "speechgpt/src/infer/cli_infer.py": SPEECHGPT_INFER,
            "speechgpt/utils/speech2unit/speech2unit.py": "class Speech2Unit:\n    pass\n",
        },
    )


def speechgpt_weights(folder: Path) -> Path:
    """SpeechGPT-7B-cm and -com, the mHuBERT units model and k-means, the unit vocoder."""
    for sub in ("SpeechGPT-7B-cm", "SpeechGPT-7B-com"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    _write(
        folder,
        {
            "speech2unit/mhubert_base_vp_en_es_fr_it3.pt": "fake",
            "speech2unit/mhubert_base_vp_en_es_fr_it3_L11_km1000.bin": "fake",
            "vocoder/vocoder.pt": "fake",
            "vocoder/config.json": "{}",
        },
    )
    return folder


# --- VAE-GSLM: `python -m scripts.hubert_kmeans` writes "<metadata line>|<units>" per file,
# `python -m scripts.infer -c <yaml>` writes <output_dir>/1.wav: the prompt's first
# sample_prior_length seconds re-synthesised, then sample_length seconds of continuation.
VAE_FILES = {
    "scripts/__init__.py": "",
    "scripts/hubert_kmeans.py": """
import argparse
import os

import soundfile as sf

parser = argparse.ArgumentParser()
parser.add_argument("-i", "--input", required=True)
parser.add_argument("-w", "--wavdir", required=True)
parser.add_argument("-o", "--output", required=True)
parser.add_argument("-m", "--model", default="facebook/hubert-large-ll60k")
parser.add_argument("-c", "--centroids", default=None)
args = parser.parse_args()
if not os.path.isdir(args.model):
    raise SystemExit(f"would download {args.model}")
assert args.centroids and os.path.isfile(args.centroids)
with open(args.input) as fh, open(args.output, "w") as out:
    for line in fh:
        if line.strip():
            x, sr = sf.read(os.path.join(args.wavdir, line.strip().split("|")[0]))
            out.write(line.strip() + "|" + " ".join(["7"] * int(len(x) / sr * 50)) + "\\n")
""",
    "scripts/infer.py": """
import argparse
import os

import numpy as np
import soundfile as sf
import yaml

parser = argparse.ArgumentParser()
parser.add_argument("-c", "--config", required=True)
args = parser.parse_args()
hp = yaml.safe_load(open(args.config))
for p in (hp["ckpt_path"], hp["vocoder"]["path"]):
    assert os.path.isdir(p), p
(line,) = [l for l in open(hp["data"]["path"]) if l.strip()]
x, sr = sf.read(os.path.join(hp["data"]["wavdir"], line.split("|")[0]))
assert len(x) / sr >= hp["data"]["min_audio_length"], "shorter than min_audio_length: dropped from the dataset"
prior = x[: int(hp["sample_prior_length"] * sr)]
cont = 0.3 * np.sin(2 * np.pi * 300 * np.arange(int(hp["sample_length"] * sr)) / sr)
os.makedirs(hp["output_dir"], exist_ok=True)
sf.write(os.path.join(hp["output_dir"], "1.wav"), np.concatenate([prior, cont]).astype(np.float32), sr)
""",
    "configs/infer/speech/vae-gslm.yaml": """identifier: "inference.speech.inferer.SpeechInferer"
precision: "16-mixed"
output_dir: "./samples"
temperature: 0.85
token_temperature: 0.85
sample_length: 10.0
sample_prior_length: 3.0
ckpt_path: "./vae-gslm_ckpt"
vocoder:
    path: "./vocoder_ckpt"
data:
    path: "./LibriSpeech-960/dev/tokens.txt"
    wavdir: "./LibriSpeech-960/dev"
    sample_rate: 16000
    num_workers: 8
    batch_size: 64
    min_audio_length: 5.0
""",
}


def vae_gslm_checkout(folder: Path) -> Path:
    """A checkout laid out like b04901014/vae-gslm (scripts/, configs/infer/speech/vae-gslm.yaml)."""
    return _write(folder, VAE_FILES)


def vae_gslm_weights(folder: Path) -> Path:
    """The release checkpoints: vae-gslm_ckpt/, vocoder_ckpt/, kmeans_v200.npy, hubert-large-ll60k/."""
    for sub in ("vae-gslm_ckpt", "vocoder_ckpt", "hubert-large-ll60k"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "kmeans_v200.npy").write_bytes(b"fake")
    return folder
