"""The shipped passage bank: complete, neutral, with provenance, readable by a reviewer."""

import json
import subprocess
import sys

import pytest

from voicebias import config
from voicebias.contract import LANGUAGES, POLES
from voicebias.params import load_params
from voicebias.pipeline.bank import run_stage
from voicebias.stimuli.bank import load_bank, render_markdown, validate_passages
from voicebias.stimuli.lint import lint_hits

PARAMS = load_params(config.ROOT / "profiles" / "embedded.yaml")
WINDOW = PARAMS["bank"]["length_window"]


@pytest.fixture(scope="module")
def bank():
    return load_bank(config.BANK_DIR)


def test_every_shipped_passage_passes_every_linter(bank):
    hits = lint_hits(bank)
    assert hits.empty, hits.to_string()


def test_bank_fills_every_cell_with_distinct_themes(bank):
    assert len(bank) == 90
    for lang in LANGUAGES:
        for pole in POLES:
            cell = bank[(bank["lang"] == lang) & (bank["pole"] == pole)]
            assert len(cell) == 10 and cell["theme"].is_unique, (lang, pole)


def test_lengths_sit_in_their_windows(bank):
    for lang in LANGUAGES:
        units = bank.loc[bank["lang"] == lang, "length_units"]
        lo, hi = WINDOW[lang]
        assert units.between(lo, hi).all(), (lang, units.min(), units.max())


def test_provenance_is_recorded(bank):
    for col in ("theme", "seed_term", "seed_source", "review_status", "gloss_en"):
        assert bank[col].notna().all() and (bank[col].astype(str).str.strip() != "").all(), col
    # stereotyped themes name the statistic behind their skew; neutral ones have none
    assert bank.loc[bank["pole"] != "neutral", "seed_statistic"].notna().all()
    # a rating always says who or what rated it
    rated = bank["intensity"].notna()
    assert (bank.loc[rated, "rated_by"].notna()).all()


def test_markdown_lists_languages_in_order_with_provenance(bank):
    md = render_markdown(bank, WINDOW)
    heads = [
        md.index(f"## {name} ({lang})") for lang, name in (("en", "English"), ("es", "Spanish"), ("zh", "Mandarin"))
    ]
    assert heads == sorted(heads)
    for p in bank.itertuples():
        section = next(i for i, lang in enumerate(LANGUAGES) if lang == p.lang)
        at = md.index(f"#### {p.passage_id}: {p.theme}")
        assert heads[section] < at < (heads[section + 1] if section + 1 < len(heads) else len(md))
        assert p.text in md and p.seed_source in md
    assert "*Gloss:*" in md and "review status: unreviewed" in md


def test_review_cli_renders_one_language(tmp_path):
    out = tmp_path / "bank_es.md"
    res = subprocess.run(
        [sys.executable, "-m", "voicebias.stimuli.bank", "render", "--lang", "es", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=config.ROOT,
    )
    assert res.returncode == 0, res.stderr
    md = out.read_text(encoding="utf-8")
    assert "## Spanish (es): 30 passages" in md and "## English" not in md and "es-feminine-10" in md


def test_stage_writes_table_metrics_and_review_copy(tmp_path, bank):
    out = tmp_path / "passages.csv"
    metrics = tmp_path / "bank" / "metrics.json"
    df = run_stage(PARAMS, bank_dir=config.BANK_DIR, out_table=out, metrics_path=metrics)
    assert len(df) == 90 and out.exists()
    m = json.loads(metrics.read_text())
    assert m["passages"] == 90 and m["lint_rules_checked"] >= 14
    assert m["review_status"] == {"unreviewed": 90} or sum(m["review_status"].values()) == 90
    assert (metrics.parent / "bank.md").read_text(encoding="utf-8").startswith("# Passage bank")


def test_stereotyped_passage_without_statistic_is_rejected(bank):
    from voicebias.validation import ValidationFailed

    df = bank.copy()
    df.loc[df["passage_id"] == "es-feminine-03", "seed_statistic"] = None
    with pytest.raises(ValidationFailed, match="seed_statistic"):
        validate_passages(df, WINDOW)


def test_validation_report_counts_lint_expectations(bank):
    report = validate_passages(bank, WINDOW)
    assert report.success and report.n_expectations >= 14 + 11
