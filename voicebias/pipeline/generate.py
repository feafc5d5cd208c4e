"""Stage 'generate'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias.clients.chat import CachedChat, make_chat
from voicebias.contract import POLES
from voicebias.errors import ConfigError, StageFailed
from voicebias.stimuli.generate import (
    generate_candidates,
    load_seeds,
    rate_candidates,
    select_passages,
    selection_yaml,
)


def run_stage(params: dict[str, Any], *, bank_dir: Path, out_dir: Path, metrics_path: Path) -> dict[str, Any]:
    """Stage 'generate': off unless generate.enabled; then writes candidates, ratings and selection."""
    from voicebias.config import CACHE_DIR
    from voicebias.io import write_json, write_table
    from voicebias.params import Generate, validate_section

    cfg = validate_section(Generate, params.get("generate"), "generate")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("candidates.csv", "ratings.csv", "selection.csv"):
        (out_dir / stale).unlink(missing_ok=True)
    if not cfg.get("enabled"):
        status = {"enabled": False, "reason": "generate.enabled is false (embedded default): no LLM was called"}
        write_json(out_dir / "status.json", status)
        write_json(Path(metrics_path), status)
        return status
    languages = list(cfg.get("languages") or params["base"]["languages"])
    windows = params["bank"]["length_window"]
    extra = cfg.get("seeds")
    seeds = load_seeds(bank_dir, languages, Path(extra) if extra else None)
    cache = Path(cfg.get("cache_dir") or CACHE_DIR / "llm")
    if "writer" not in cfg or not cfg.get("judges"):
        raise ConfigError("generate needs a 'writer' and a non-empty 'judges' list (see params generate)")
    writer = CachedChat(make_chat(cfg["writer"]), cache)
    judges = [(j.get("name") or f"judge{i + 1}", CachedChat(make_chat(j), cache)) for i, j in enumerate(cfg["judges"])]
    if len({n for n, _ in judges}) != len(judges):
        raise ConfigError("generate.judges: every judge needs a distinct name")
    base_seed = int(params.get("base", {}).get("seed", 0))
    cands = generate_candidates(seeds, writer, cfg, windows, base_seed)
    ratings = rate_candidates(cands, judges, cfg)
    selection = select_passages(cands, ratings, cfg, len(judges))
    panel = "LLM panel: " + ", ".join(f"{n} ({j.backend.describe()})" for n, j in judges)
    write_table(out_dir / "candidates.csv", cands)
    write_table(out_dir / "ratings.csv", ratings)
    write_table(out_dir / "selection.csv", selection)
    sel_dir = out_dir / "selection"
    sel_dir.mkdir(exist_ok=True)
    for old in sel_dir.glob("*.yaml"):
        old.unlink()
    for lang, text in selection_yaml(selection, cands, panel).items():
        (sel_dir / f"{lang}.yaml").write_text(text, encoding="utf-8")
    per_cell = int(cfg["per_cell"])
    counts = selection.groupby(["lang", "pole"]).size()
    short = {
        f"{lang}_{p}": int(counts.get((lang, p), 0))
        for lang in languages
        for p in POLES
        if counts.get((lang, p), 0) < per_cell
    }
    status = {
        "enabled": True,
        "writer": writer.backend.describe(),
        "judges": [j.backend.describe() for _, j in judges],
        "seeds": int(len(seeds)),
        "candidates": int(len(cands)),
        "candidate_status": {k: int(v) for k, v in cands["status"].value_counts().sort_index().items()},
        "ratings": int(len(ratings)),
        "invalid_ratings": int((ratings["status"] != "ok").sum()),
        "selected": int(len(selection)),
        "per_cell": per_cell,
        "short_cells": short,
        "llm_calls": writer.calls + sum(j.calls for _, j in judges),
    }
    write_json(out_dir / "status.json", {k: v for k, v in status.items() if k != "llm_calls"})
    write_json(Path(metrics_path), status)
    if short:
        raise StageFailed(
            f"generate: fewer than {per_cell} passages passed the gates in {short}; raise "
            "candidates_per_seed or add seeds (candidates, ratings and the partial selection are "
            f"written to {out_dir})"
        )
    return status
