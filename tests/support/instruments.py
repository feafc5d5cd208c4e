"""Instrument test doubles: a small ECAPA folder in the hub layout and a continuation system without text."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import torch

from voicebias.systems.base import ContinuationSystem, S2SResponse

# The layout of speechbrain/spkrec-ecapa-voxceleb's hyperparams.yaml, with a small network.
HPARAMS = textwrap.dedent("""\
    pretrained_path: speechbrain/spkrec-ecapa-voxceleb
    n_mels: 80
    compute_features: !new:speechbrain.lobes.features.Fbank
        n_mels: !ref <n_mels>
    mean_var_norm: !new:speechbrain.processing.features.InputNormalization
        norm_type: sentence
        std_norm: False
    embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
        input_size: !ref <n_mels>
        channels: [32, 32, 32, 32, 96]
        kernel_sizes: [5, 3, 3, 3, 1]
        dilations: [1, 2, 3, 4, 1]
        attention_channels: 16
        lin_neurons: 192
    classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
        input_size: 192
        out_neurons: 4
    mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
        norm_type: global
        std_norm: False
    modules:
        compute_features: !ref <compute_features>
        mean_var_norm: !ref <mean_var_norm>
        embedding_model: !ref <embedding_model>
        mean_var_norm_emb: !ref <mean_var_norm_emb>
        classifier: !ref <classifier>
    label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder
    pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
        loadables:
            embedding_model: !ref <embedding_model>
            mean_var_norm_emb: !ref <mean_var_norm_emb>
            classifier: !ref <classifier>
            label_encoder: !ref <label_encoder>
        paths:
            embedding_model: !ref <pretrained_path>/embedding_model.ckpt
            mean_var_norm_emb: !ref <pretrained_path>/mean_var_norm_emb.ckpt
            classifier: !ref <pretrained_path>/classifier.ckpt
            label_encoder: !ref <pretrained_path>/label_encoder.txt
    """)


def build_ecapa_folder(folder: Path, seed: int = 0):
    """Random ECAPA-TDNN weights saved in the hub's file layout; returns the network."""
    from speechbrain.dataio.encoder import CategoricalEncoder
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    (folder / "hyperparams.yaml").write_text(HPARAMS)
    model = ECAPA_TDNN(80, channels=[32, 32, 32, 32, 96], attention_channels=16, lin_neurons=192).eval()
    torch.save(model.state_dict(), folder / "embedding_model.ckpt")
    torch.save(Classifier(192, out_neurons=4).state_dict(), folder / "classifier.ckpt")
    InputNormalization(norm_type="global", std_norm=False)._save(folder / "mean_var_norm_emb.ckpt")
    enc = CategoricalEncoder()
    enc.update_from_iterable(["spk0", "spk1", "spk2", "spk3"])
    enc.save(folder / "label_encoder.txt")
    return model


class Continuer(ContinuationSystem):
    """Continues every prompt with 1 s of tone; no text stream."""

    def __init__(self):
        super().__init__("continuer", {"adapter": "test", "revision": "t1"}, {})
        self.calls = 0

    def continue_speech(self, request):
        self.calls += 1
        t = np.arange(16000) / 16000
        return S2SResponse("ok", audio=(0.2 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sample_rate=16000)
