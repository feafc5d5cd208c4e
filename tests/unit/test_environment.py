"""The installed stack imports and runs offline: SpeechBrain's ECAPA on torchaudio."""

import numpy as np


def test_speechbrain_ecapa_embeds_offline():
    import torch
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    torch.manual_seed(0)
    wav = torch.tensor(np.sin(2 * np.pi * 150 * np.arange(16000) / 16000), dtype=torch.float32)[None]
    feats = Fbank(n_mels=80)(wav)
    emb = ECAPA_TDNN(80, lin_neurons=192).eval()(feats)
    assert tuple(emb.shape) == (1, 1, 192) and torch.isfinite(emb).all()
