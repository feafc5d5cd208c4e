"""Stage 'sc_scoring' of the speech-continuation (SC) study.

Per continuation: success, speaker similarity to the prompt
(`acoustics.speaker_embedding`), H1-H2, H1-A3 and CPPS (analysis settings of the
prompt's voice gender), and the judge's five rubric scores on the transcript
(`sc_judge`). Writes data/sc_scored/<system>.csv with the contract column names.
No system is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from voicebias.contract import F0_ST, SC_COMPONENTS, SC_MEASURES, SC_SCORED_COLUMNS


def _judge_key(judge_params: dict[str, Any], rubric: dict[str, Any], prompt: str, text: str) -> str:
    """Content key of one judgement: judge settings, rubric template and dimensions, both transcripts."""
    from voicebias.cache import content_key

    return content_key(
        {
            "judge": judge_params,
            "template": rubric.get("template"),
            "dimensions": rubric.get("dimensions"),
            "prompt": prompt,
            "continuation": text,
        }
    )


def judge_all(
    judge: Any,
    df: pd.DataFrame,
    dims: list[str],
    judge_params: dict[str, Any],
    rubric: dict[str, Any],
    cache_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Judge every continuation with a transcript: `sc_judge.max_concurrency` calls at a
    time (default 1), successful verdicts cached by content under cache_dir (judge
    settings, rubric, both transcripts), so re-scoring never pays for a judgement twice.
    Failed judgements are recorded, never cached, and asked again on the next run."""
    from concurrent.futures import ThreadPoolExecutor

    from voicebias.cache import JsonCache

    cache = JsonCache(cache_dir) if cache_dir else None

    def one(r: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"stimulus_id": r.stimulus_id}
        text = r.transcript if isinstance(r.transcript, str) else ""
        if r.status != "ok" or not text.strip():
            return {
                **row,
                "judge_status": "not_judged",
                "judge_error": "no continuation transcript"
                if r.status == "ok"
                else "continuation failed"
                if r.status == "failed"
                else f"continuation excluded ({getattr(r, 'reason', None)})",
            }
        key = _judge_key(judge_params, rubric, str(r.prompt_text), text)
        cached = cache.get(key) if cache is not None else None
        if cached is not None:
            return {**row, **cached}
        res = judge.judge(str(r.prompt_text), text)
        out = {
            "judge_status": res.status,
            "judge_error": res.error,
            "judge_name": res.judge,
            "judge_version": getattr(res, "version", "") or "",
            **{d: res.scores.get(d) for d in dims},
        }
        if cache is not None and res.status == "ok":
            cache.put(key, out)
        return {**row, **out}

    rows = list(df.itertuples(index=False))
    workers = int(judge_params["max_concurrency"])
    if workers == 1:
        return [one(r) for r in tqdm(rows, desc="judge")]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(tqdm(pool.map(one, rows), total=len(rows), desc="judge"))


def score_continuations(
    responses: pd.DataFrame,
    manifest: pd.DataFrame,
    params: dict[str, Any],
    root: Path,
    judge: Any | None = None,
    embedder: Any | None = None,
    cache_dir: Path | None = None,
    measure_cache: Path | None = None,
    embedding_cache: Path | None = None,
) -> pd.DataFrame:
    """One row per continuation: contract columns, voice quality, similarity, judge scores."""
    from voicebias.instruments.acoustics import measure_table
    from voicebias.instruments.embeddings import embedder_from_params, speaker_similarity
    from voicebias.instruments.judge import get_judge, load_rubric

    meta = manifest[["stimulus_id", "prompt_id", "prompt_set", "voice_gender", "voice_id", "phonation", "text", "path"]]
    df = responses.drop(columns=[c for c in ("voice_gender", "voice_id", "phonation") if c in responses]).merge(
        meta.rename(columns={"text": "prompt_text", "path": "prompt_audio"}), on="stimulus_id", how="left"
    )
    ok = df[df["status"] == "ok"].copy()
    measured = measure_table(
        ok,
        "output_audio",
        "stimulus_id",
        "voice_gender",
        params["acoustics"],
        Path(root),
        16000,
        desc="continuation voice quality",
        cache_dir=measure_cache,
        components=SC_COMPONENTS,
    )
    measured = measured.rename(columns={"status_y": "measure_status"})
    if "measure_status" not in measured:
        measured = measured.rename(columns={"status": "measure_status"})
    cols = ["stimulus_id", *SC_MEASURES, F0_ST, "measure_status"]
    df = df.merge(measured[[c for c in cols if c in measured]], on="stimulus_id", how="left")
    embedder = embedder or embedder_from_params(params["acoustics"], root)
    sims = speaker_similarity(
        ok[["stimulus_id", "prompt_audio", "output_audio"]],
        embedder,
        reference_col="prompt_audio",
        output_col="output_audio",
        root=Path(root),
        cache_dir=embedding_cache,
    )
    df = df.merge(sims[["stimulus_id", "speaker_similarity"]], on="stimulus_id", how="left")
    judge_params = params.get("sc_judge") or {}
    judge = judge or get_judge(judge_params)
    rubric = load_rubric()
    dims = rubric["dimensions"]
    jrows = judge_all(judge, df, dims, judge_params, rubric, cache_dir)
    df = df.merge(pd.DataFrame(jrows), on="stimulus_id", how="left")
    for c in SC_SCORED_COLUMNS + dims:
        if c not in df:
            df[c] = None
    return df[SC_SCORED_COLUMNS + dims]
