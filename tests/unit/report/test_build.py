"""The audit report renders from jinja2 templates: every section's title, caption, table and
figure appears in both formats, in the order of templates/sections.yaml, and the texts live
in the templates, not in Python."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import markupsafe
import pandas as pd
import pytest
import yaml

from voicebias import config
from voicebias.params import load_params
from voicebias.report import build as report

TEMPLATES = config.ROOT / "voicebias" / "report" / "templates"

PARAMS = {
    "base": {"profile": "tiny", "languages": ["en", "es"]},
    "run": {"systems": ["sys_a", "sys_b"]},
    "tts": {"backend": "espeak"},
}


def intro_context(sc_systems=()):
    return {
        "params": PARAMS,
        "bank": {"passages": 12},
        "sc_systems": list(sc_systems),
        "phonation": {"conditions": ["modal", "breathy"]},
        "sc_judge": {},
    }


def small_sections() -> dict[str, report.Section]:
    """One two-row table per section of sections.yaml, each with a cell naming its section."""
    keys = list(report.section_texts()["sections"])
    return {
        k: report.Section(
            pd.DataFrame({"section": [f"cell-{k}", "<.001***"], "value": [i, 0.5]}), f"{k}.png" if i % 3 == 0 else None
        )
        for i, k in enumerate(keys)
    }


def test_every_section_title_caption_table_and_figure_renders_in_order():
    texts = report.section_texts()
    sections = small_sections()
    out = report.render_report(sections, intro_context())
    md, page = out["md"], out["html"]
    assert md.startswith(f"# {texts['title']}\n")
    assert f"<h1>{texts['title']}</h1>" in page
    pos_md, pos_html = [], []
    for key, meta in texts["sections"].items():
        assert f"## {meta['title']}\n\n{meta['caption']}\n" in md
        assert f"| cell-{key} " in md
        assert f"<td>cell-{key}</td>" in page
        assert f"<h2>{markupsafe.escape(meta['title'])}</h2>\n<p>{markupsafe.escape(meta['caption'])}</p>" in page
        if sections[key].figure:
            assert f"![{meta['title']}](figures/{key}.png)" in md
            assert f'<img src="figures/{key}.png"' in page
        else:
            assert f"figures/{key}.png" not in md + page
        pos_md.append(md.index(f"cell-{key}"))
        pos_html.append(page.index(f"cell-{key}"))
    assert pos_md == sorted(pos_md) and pos_html == sorted(pos_html)
    assert md.count("\n## ") == len(texts["sections"]) == page.count("<h2>") == page.count("<table")


def test_cells_are_shown_as_formatted_and_escaped_only_in_html():
    out = report.render_report(
        {
            "carrier_gate": report.Section(
                pd.DataFrame({"p": ["<.001***", "9.27e-04"], "n": [3, 4], "x": [0.5, float("nan")]})
            )
        },
        intro_context(),
    )
    assert "| <.001*** " in out["md"] and "| 9.27e-04 " in out["md"]  # no number re-parsing by tabulate
    assert "<td>&lt;.001***</td>" in out["html"] and "<td>9.27e-04</td>" in out["html"]
    assert "<td>0.5</td>" in out["html"] and "<td>nan</td>" in out["html"]  # cells as str(), not reformatted
    assert "<.001***" not in out["html"]


def test_sections_without_a_table_are_left_out_and_unknown_keys_refused():
    texts = report.section_texts()["sections"]
    out = report.render_report({"planted": report.Section(pd.DataFrame({"a": [1]}))}, intro_context())
    assert texts["planted"]["title"] in out["md"]
    assert texts["carrier_gate"]["title"] not in out["md"] and texts["carrier_gate"]["title"] not in out["html"]
    with pytest.raises(KeyError, match="not_a_section"):
        report.render_report({"not_a_section": report.Section(pd.DataFrame({"a": [1]}))}, intro_context())


def test_intro_names_the_run_and_the_continuation_study_only_when_it_ran():
    plain = report.render_report({}, intro_context())["md"]
    assert (
        "Profile: tiny. Systems: sys_a, sys_b. Passages: 12 (en, es x masculine/neutral/feminine), each voiced "
        "by one male and one female voice (espeak).\n"
    ) in plain
    assert "Speech continuation" not in plain
    sc = report.render_report({}, intro_context(["cont_x"]))["html"]
    assert (
        "Speech continuation: cont_x on the SC prompts in 2 phonation conditions (parametric converter), "
        "judge lexical_heuristic.</p>"
    ) in sc


def test_captions_live_in_the_templates_not_in_python():
    source = (config.ROOT / "voicebias" / "report" / "build.py").read_text(encoding="utf-8")
    texts = yaml.safe_load((TEMPLATES / "sections.yaml").read_text(encoding="utf-8"))
    assert texts == report.section_texts()
    for key, meta in texts["sections"].items():
        assert meta["caption"] not in source and meta["title"] not in source, key
        assert meta["caption"][:40] not in source, key
    assert "layout of the S2S paper's Table 6" in texts["sections"]["carrier_gate"]["caption"]
    intro = (TEMPLATES / "intro.txt.j2").read_text(encoding="utf-8")
    assert "each voiced by one male and one female voice" in intro and "each voiced by" not in source


def test_a_caption_edited_in_the_template_changes_the_report(monkeypatch):
    texts = report.section_texts()
    texts["sections"]["compliance"]["caption"] = "An edited caption."
    monkeypatch.setattr(report, "section_texts", lambda: texts)
    out = report.render_report({"compliance": report.Section(pd.DataFrame({"a": [1]}))}, intro_context())
    assert "An edited caption." in out["md"] and "<p>An edited caption.</p>" in out["html"]


def test_rq1_tables_show_new_analysis_columns_as_they_are():
    mixed = pd.DataFrame(
        [
            {
                "system": "s",
                "lang": "en",
                "task": "readback",
                "task_group": "same-language",
                "measure": "delta_composite",
                "units": "SD",
                "n": 60,
                **{
                    f"{q}_{s}": v
                    for q in ("stereotype_effect", "misaligned_minus_neutral")
                    for s, v in (
                        ("est", 0.2),
                        ("se", 0.01),
                        ("df", 27.0),
                        ("ci_low", 0.18),
                        ("ci_high", 0.22),
                        ("p", 1e-5),
                    )
                },
                "chi2_interaction": 0.3,
                "df": 2,
                "f_interaction": 0.15,
                "den_df_interaction": 27.0,
                "p_interaction": 0.84,
                "converged": True,
                "warning": "",
                "text_matched_est": 0.01234,
                "text_matched_p": 0.03,
            }
        ]
    )
    eff = report.rq1_effects_table(mixed)
    assert list(eff.columns[-2:]) == ["text_matched_est", "text_matched_p"]
    assert eff.iloc[0]["text_matched_est"] == "0.012" and eff.iloc[0]["text_matched_p"] == "0.030*"
    assert eff.iloc[0]["toward stereotype, per content step"] == "0.200 [0.180, 0.220] p=<.001***"
    pooled = pd.DataFrame(
        [
            {
                "system": "s",
                "task_group": "same-language",
                "measure": "delta_composite",
                "n_cells": 3,
                "n_systems": 1,
                "n_voiced_passages": 120,
                "pooled_contrast": 0.2,
                "se": 0.01,
                "df": 40.0,
                "ci_low": 0.18,
                "ci_high": 0.22,
                "p_value": 0.2,
                "text_matched_contrast": 0.05,
            }
        ]
    )
    pool = report.rq1_pooled_table(pooled)
    assert list(pool.columns) == [
        "system",
        "task_group",
        "measure",
        "n_voiced_passages",
        "contrast [95% CI]",
        "p",
        "text_matched_contrast",
    ]
    assert pool.iloc[0]["text_matched_contrast"] == "0.050"
    md = report.render_report(
        {"rq1_effects": report.Section(eff), "rq1_pooled": report.Section(pool)}, intro_context()
    )["md"]
    assert "text_matched_est" in md and "text_matched_contrast" in md


def test_templates_are_package_data_and_a_report_stage_dependency():
    project = tomllib.loads((config.ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = project["tool"]["setuptools"]["package-data"]["voicebias"]
    files = sorted(p.relative_to(config.ROOT / "voicebias").as_posix() for p in TEMPLATES.iterdir() if p.is_file())
    assert {
        "report/templates/report.html.j2",
        "report/templates/report.md.j2",
        "report/templates/sections.yaml",
    } <= set(files)
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)
    deps = yaml.safe_load((config.ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["report"]["deps"]
    assert "voicebias/report/templates" in deps


def test_build_report_writes_both_formats_from_the_stage_outputs(tmp_path):
    analysis = config.REPORTS / "analysis"
    needed = [
        analysis / f
        for f in (
            "describe_odds_ratios.csv",
            "describe_misgender.csv",
            "summarize_pronouns.csv",
            "describe_fisher.csv",
            "planted_vs_recovered.csv",
            "compliance.csv",
        )
    ]
    needed += [config.REPORTS / "carrier_gate" / "gate.csv", config.REPORTS / "bank" / "metrics.json"]
    if not all(Path(p).exists() for p in needed):
        pytest.skip("the analysis outputs are not checked out (dvc pull / dvc repro)")
    params = load_params()
    paths = report.build_report(
        params, analysis, config.REPORTS / "carrier_gate", config.REPORTS / "bank" / "metrics.json", tmp_path
    )
    md, page = paths["md"].read_text(encoding="utf-8"), paths["html"].read_text(encoding="utf-8")
    texts = report.section_texts()["sections"]
    for key in (
        "carrier_gate",
        "describe_odds",
        "describe_misgender",
        "describe_fisher",
        "summarize_pronouns",
        "planted",
        "compliance",
    ):
        assert f"## {texts[key]['title']}" in md
        assert f"<h2>{texts[key]['title']}</h2>" in page
    assert (tmp_path / "figures" / "odds_ratio_forest.png").stat().st_size > 0
    assert texts["sc_success"]["title"] not in md  # no SC directories given
    assert texts["psychometric"]["title"] not in md  # no continuum given
    with_continuum = report.build_report(
        params,
        analysis,
        config.REPORTS / "carrier_gate",
        config.REPORTS / "bank" / "metrics.json",
        tmp_path / "with",
        psychometric_dir=config.REPORTS / "psychometric",
    )
    md = with_continuum["md"].read_text(encoding="utf-8")
    assert f"## {texts['psychometric']['title']}" in md and "figures/psychometric.png" in md
    assert "shift (st) [95% CI]" in md and (tmp_path / "with" / "figures" / "psychometric.png").stat().st_size > 0


def _sc_dis_and_tables():
    """A disaggregated table of hand-made SC items, and the report's similarity and judge tables of them."""
    import numpy as np

    from voicebias.analysis.disaggregated import disaggregate, sc_items
    from voicebias.analysis.sc import judge_score_table
    from voicebias.analysis.sc_stats import similarity_table

    rng = np.random.default_rng(3)
    rows = [
        {
            "system": "s",
            "stimulus_id": f"p{i}",
            "lang": "en",
            "phonation": ("modal", "breathy")[i % 2],
            "voice_gender": ("male", "female")[(i // 2) % 2],
            "status": "ok",
            "measure_status": "ok",
            "judge_status": "ok",
            "speaker_similarity": rng.uniform(0.4, 0.8),
            "semantic_coherence": float(rng.integers(1, 6)),
        }
        for i in range(40)
    ]
    scored = pd.DataFrame(rows)
    dis = disaggregate(sc_items(scored), resamples=300, seed=1)
    return dis, similarity_table(scored), judge_score_table(scored, ["semantic_coherence"])


def test_sc_table_2_and_fig_2_cells_carry_the_bootstrap_ci():
    dis, sim, scores = _sc_dis_and_tables()
    t = report.sc_similarity_table(sim, dis)
    row = dis[
        (dis["metric"] == "speaker_similarity")
        & (dis["lang"] == "ALL")
        & (dis["condition"] == "breathy")
        & (dis["voice_gender"] == "female")
    ].iloc[0]
    cell = t.set_index("VQ Mod.").loc["Breathy", "s Female"]
    assert cell.startswith(f"{row.estimate:.2f} ± ") and cell.endswith(f"[{row.ci_low:.2f}, {row.ci_high:.2f}]")
    assert "[" not in report.sc_similarity_table(sim).iloc[0, 1]  # without the table: mean ± SD only
    j = report.judge_table(scores, dis)
    assert j["s Male"].str.contains(r"^\d\.\d\d \(\d\.\d\d\) \[\d\.\d\d, \d\.\d\d\]$").all()
    assert set(j["VQ"]) == {"Unmod.", "Breathy", "All"}


def test_figures_draw_with_cis_and_name_a_fit_without_estimate(tmp_path):
    from voicebias.analysis.disaggregated import disaggregate, s2s_items

    rows = [
        {
            "system": sys_,
            "task": "describe",
            "stimulus_id": f"{sys_}{lang}{v}{p}{i}",
            "lang": lang,
            "pole": p,
            "voice_gender": v,
            "status": "ok",
            "pronoun_choice": None,
            "judged_gender": ("female", "male")[(i + len(p)) % 2],
        }
        for sys_ in ("a", "b")
        for lang in ("en", "zh")
        for v in ("male", "female")
        for p in ("masculine", "neutral", "feminine")
        for i in range(6)
    ]
    dis = disaggregate(s2s_items(pd.DataFrame(rows), None), resamples=200, seed=1)
    cells = report.misgender_cells(pd.DataFrame(), dis)
    assert set(cells["lang"]) == {"ALL", "en", "zh"} and cells[["ci_low", "ci_high"]].notna().all().all()
    report.fig_misgender(cells, tmp_path / "m.png")
    odds = pd.DataFrame(
        {
            "system": ["a", "a", "b", "b"],
            "lang": ["ALL", "zh", "ALL", "zh"],
            "odds_ratio": [3.0, float("nan"), 1.2, 0.8],
            "ci_low": [1.5, float("nan"), 0.6, 0.2],
            "ci_high": [6.0, float("nan"), 2.4, 3.1],
            "fit_status": ["ok", "perfect separation (quasi-complete)", "ok", "ok"],
        }
    )
    report.fig_forest(odds, tmp_path / "f.png")
    assert (tmp_path / "m.png").stat().st_size > 10_000 and (tmp_path / "f.png").stat().st_size > 10_000
