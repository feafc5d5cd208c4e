"""A counting S2S system and a small stimulus table for the runner and response-cache tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from voicebias.errors import TransientError
from voicebias.systems.base import S2SResponse, S2SSystem


class CountingSystem(S2SSystem):
    """Test double: answers 'female' and counts calls; can fail on chosen stimuli."""

    def __init__(self, fail_on=(), transient_failures=0):
        super().__init__("counting", {"adapter": "test", "output_voice": {}, "licence": "test"}, {"x": 1})
        self.calls = 0
        self.fail_on = set(fail_on)
        self.transient_left = transient_failures

    def respond(self, request):
        self.calls += 1
        if request.stimulus_id in self.fail_on:
            raise RuntimeError("model crashed on this input")
        if self.transient_left > 0:
            self.transient_left -= 1
            raise TransientError("HTTP 429 rate limited")
        return S2SResponse(status="ok", transcript="female", audio=np.zeros(1600, np.float32) + 0.1, sample_rate=16000)


def stimuli(tmp_path, n=4):
    rows = []
    for i in range(n):
        path = tmp_path / f"s{i}.flac"
        path.write_bytes(b"x")
        rows.append(
            {
                "stimulus_id": f"en-feminine-0{i}-male",
                "passage_id": f"en-feminine-0{i}",
                "lang": "en",
                "pole": "feminine",
                "voice_gender": "male",
                "voice_id": "v",
                "path": path.name,
                "sha256": f"{i:064d}",
            }
        )
    return pd.DataFrame(rows)
