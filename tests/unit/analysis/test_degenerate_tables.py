"""Every analysis on degenerate tables: rows with an explicit status and reason, never an exception.

Hypothesis generates tables for each analysis family (describe, summarize, RQ1, SC,
disaggregated) with the cases real systems produce: complete and quasi-complete
separation, empty cells, one language, one voice gender or one pole missing, every
answer one class or 'none', constant measures, two rows, no rows. Each property asserts
that the analysis returns, that every row's status is in the vocabulary
(voicebias.analysis.status), that 'ok' rows have finite estimates and that every other
row carries a reason. The runs are derandomized (the same examples on every machine) and
small enough for a 2-core CI runner.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from voicebias.analysis.status import OK, SEPARATION, STATUSES
from voicebias.contract import CONDITIONS, GENDERS, POLES

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LANGS = ("en", "zh")


def assert_statuses(df: pd.DataFrame, finite_when_ok: list[str], finite_when_separated: list[str] = ()) -> None:
    """Every row has a status of the vocabulary; ok rows have finite `finite_when_ok`, separation rows
    finite `finite_when_separated`; every row that is not ok says why."""
    assert {"status", "reason"} <= set(df.columns), f"no status columns in {list(df.columns)}"
    assert set(df["status"]) <= set(STATUSES), set(df["status"])
    ok = df[df["status"] == OK]
    for col in finite_when_ok:
        assert np.isfinite(ok[col].astype(float)).all(), (col, ok[[col, "reason"]])
    sep = df[df["status"] == SEPARATION]
    for col in finite_when_separated:
        assert np.isfinite(sep[col].astype(float)).all(), (col, sep[[col, "reason"]])
    bad = df[df["status"] != OK]
    assert (bad["reason"].astype(str).str.strip().str.len() > 0).all(), bad


# ------------------------------------------------------------------ describe and summarize answers


def answer(rule: str, pole: str, voice: str, rng: np.random.Generator) -> str:
    """The judged gender a system with `rule` gives (content-driven, voice-driven, one class, ...)."""
    if rule == "content":  # complete separation on the content step
        return "female" if pole == "feminine" else "male"
    if rule == "content quasi":  # quasi-complete: neutral content split
        return {"feminine": "female", "masculine": "male"}.get(pole, "female" if rng.random() < 0.5 else "male")
    if rule == "voice":
        return voice
    if rule in ("female", "male", "none"):
        return rule
    return str(rng.choice(["female", "male", "none"], p=[0.45, 0.45, 0.1]))


@st.composite
def s2s_tables(draw, task: str = "describe") -> pd.DataFrame:
    """Scored S2S rows of one or two systems for `task`, with cells, languages, voices or poles missing."""
    langs = draw(st.lists(st.sampled_from(LANGS), min_size=1, max_size=2, unique=True))
    poles = draw(st.lists(st.sampled_from(POLES), min_size=1, max_size=3, unique=True))
    voices = draw(st.lists(st.sampled_from(GENDERS), min_size=1, max_size=2, unique=True))
    per_cell = draw(st.integers(0, 4))
    samples = draw(st.sampled_from([1, 1, 2]))
    rules = draw(
        st.lists(
            st.sampled_from(["content", "content quasi", "voice", "female", "male", "none", "random"]),
            min_size=1,
            max_size=2,
        )
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rows = []
    for s, rule in enumerate(rules):
        for lang in langs:
            for pole in poles:
                for voice in voices:
                    for i in range(per_cell):
                        for k in range(samples):
                            word = answer(rule, pole, voice, rng)
                            rows.append(
                                {
                                    "system": f"sys{s}",
                                    "task": task,
                                    "status": "ok",
                                    "lang": lang,
                                    "pole": pole,
                                    "voice_gender": voice,
                                    "stimulus_id": f"{lang}-{pole}-{voice}-{i}",
                                    "sample": k,
                                    "judged_gender": word,
                                    "pronoun_choice": word,
                                }
                            )
    df = pd.DataFrame(
        rows,
        columns=[
            "system",
            "task",
            "status",
            "lang",
            "pole",
            "voice_gender",
            "stimulus_id",
            "sample",
            "judged_gender",
            "pronoun_choice",
        ],
    )
    keep = draw(st.integers(2, max(2, len(df)))) if draw(st.booleans()) else len(df)
    df = df.iloc[:keep]
    return df if samples > 1 else df.drop(columns=["sample"])


def separated_table() -> pd.DataFrame:
    """The headline case: 'female' exactly when the content is feminine, both voices, several passages."""
    return pd.DataFrame(
        [
            {
                "system": "api",
                "task": "describe",
                "status": "ok",
                "lang": "en",
                "pole": pole,
                "voice_gender": voice,
                "stimulus_id": f"{pole}-{voice}-{i}",
                "judged_gender": "female" if pole == "feminine" else "male",
                "pronoun_choice": "none",
            }
            for pole in POLES
            for voice in GENDERS
            for i in range(12)
        ]
    )


EMPTY = separated_table().iloc[:0]
TWO_ROWS = separated_table().iloc[[0, -1]]


@SETTINGS
@given(table=s2s_tables("describe"))
@example(table=separated_table())
@example(table=EMPTY)
@example(table=TWO_ROWS)
@example(table=separated_table().assign(judged_gender="none"))
def test_describe_never_raises(table):
    from voicebias.analysis.s2s import describe_misgender, describe_odds_ratios

    odds = describe_odds_ratios(table)
    assert_statuses(odds, ["odds_ratio", "ci_low", "ci_high", "p_value", "firth_odds_ratio"], ["firth_odds_ratio"])
    rates, fisher = describe_misgender(table)
    assert_statuses(rates, ["rate"])
    assert_statuses(fisher, ["p_value", "odds_ratio"], ["p_value"])
    # the status keeps the older column's meaning
    assert (odds["status"] == OK).sum() == (odds["fit_status"] == "ok").sum()


@SETTINGS
@given(table=s2s_tables("summarize"))
@example(table=separated_table().assign(task="summarize", pronoun_choice="none"))
@example(table=EMPTY.assign(task="summarize"))
@example(table=TWO_ROWS.assign(task="summarize", pronoun_choice="female"))
def test_summarize_never_raises(table):
    from voicebias.analysis.s2s import injection_controls, summarize_pronouns

    for by_language in (False, True):
        pron = summarize_pronouns(table, by_language=by_language)
        assert_statuses(pron, ["delta_pp", "injection_rate"])
    assert_statuses(injection_controls(table.assign(task="paraphrase")), ["injection_rate"])


# ------------------------------------------------------------------ RQ1 acoustic deltas


@st.composite
def acoustic_tables(draw) -> pd.DataFrame:
    """Acoustic rows of readback and paraphrase: few passages, missing cells, constant or noisy deltas."""
    langs = draw(st.lists(st.sampled_from(LANGS), min_size=1, max_size=2, unique=True))
    poles = draw(st.lists(st.sampled_from(POLES), min_size=1, max_size=3, unique=True))
    voices = draw(st.lists(st.sampled_from(GENDERS), min_size=1, max_size=2, unique=True))
    passages = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["noise", "constant", "per passage", "one value"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    passage_effect = rng.normal(0, 1, 100)
    rows = []
    for lang in langs:
        for task in ("readback", "paraphrase"):
            for pole in poles:
                for i in range(passages):
                    pid = f"{lang}-{pole}-{i}"
                    for voice in voices:
                        value = {
                            "noise": rng.normal(0, 1),
                            "constant": 0.0,
                            "one value": 1.5,
                            "per passage": passage_effect[hash(pid) % 100],
                        }[kind]
                        rows.append(
                            {
                                "system": "sys",
                                "task": task,
                                "status": "ok",
                                "lang": lang,
                                "pole": pole,
                                "voice_gender": voice,
                                "passage_id": pid,
                                "stimulus_id": f"{pid}-{voice}",
                                "delta_composite": value,
                                "delta_f0_median_st": value * 2,
                            }
                        )
    df = pd.DataFrame(
        rows,
        columns=[
            "system",
            "task",
            "status",
            "lang",
            "pole",
            "voice_gender",
            "passage_id",
            "stimulus_id",
            "delta_composite",
            "delta_f0_median_st",
        ],
    )
    keep = draw(st.integers(0, len(df))) if draw(st.booleans()) else len(df)
    return df.iloc[:keep]


@SETTINGS
@given(table=acoustic_tables())
def test_rq1_never_raises(table):
    from voicebias.analysis.rq1 import rq1_contrasts, rq1_mixed_models, rq1_pooled, rq1_significance_counts

    contrasts = rq1_contrasts(table)
    assert_statuses(contrasts, ["contrast", "t", "p_value"])
    mixed = rq1_mixed_models(table)
    assert_statuses(
        mixed,
        [
            f"{e}_{f}"
            for e in ("stereotype_effect", "misaligned_minus_neutral")
            for f in ("est", "se", "p", "ci_low", "ci_high")
        ],
    )
    for pool in (False, True):
        assert_statuses(rq1_pooled(table, pool_systems=pool), ["pooled_contrast", "se", "ci_low", "ci_high", "p_value"])
    counts = rq1_significance_counts(contrasts, mixed)
    assert (
        counts["n_cells"]
        == [int(((contrasts["system"] == s) & (contrasts["status"] == OK)).sum()) for s in counts["system"]]
    ).all()


# ------------------------------------------------------------------ SC scored continuations

DIMS = (
    "semantic_coherence",
    "sentence_polarity",
    "agency_competence",
    "emotionalisation_affect_framing",
    "appearance_objectification",
)


@st.composite
def sc_tables(draw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A scored continuation table and the prompts' measures: voices, conditions or systems missing,
    constant measures or scores, few prompts, failed calls."""
    genders = draw(st.lists(st.sampled_from(GENDERS), min_size=1, max_size=2, unique=True))
    conds = draw(st.lists(st.sampled_from(CONDITIONS), min_size=1, max_size=4, unique=True))
    systems = draw(st.integers(1, 2))
    voices_per_gender = draw(st.integers(1, 2))
    prompts = draw(st.integers(1, 3))
    measures = draw(st.sampled_from(["noise", "constant"]))
    scores = draw(st.sampled_from(["random", "constant", "two values"]))
    failed = draw(st.floats(0, 0.5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pm, sc = [], []
    for g in genders:
        for v in range(voices_per_gender):
            for p in range(prompts):
                base = rng.normal([0.0, 10.0, 14.0], 1.0) if measures == "noise" else np.array([1.0, 2.0, 3.0])
                for c in conds:
                    sid = f"p{p}-{g}{v}-{c}"
                    common = {
                        "stimulus_id": sid,
                        "prompt_id": f"p{p}",
                        "voice_gender": g,
                        "voice_id": f"{g}{v}",
                        "phonation": c,
                    }
                    pm.append(
                        {
                            **common,
                            "measure_status": "ok",
                            "h1_h2_db_whole": base[0],
                            "h1_a3_db_whole": base[1],
                            "cpps_db_whole": base[2],
                        }
                    )
                    for s in range(systems):
                        cont = base + (rng.normal(0, 0.3, 3) if measures == "noise" else 0.0)
                        judge = {
                            d: int({"random": rng.integers(1, 6), "constant": 3, "two values": 2 + (p % 2)}[scores])
                            for d in DIMS
                        }
                        sc.append(
                            {
                                **common,
                                "system": f"sys{s}",
                                "lang": "en",
                                "status": "failed" if rng.random() < failed else "ok",
                                "measure_status": "ok",
                                "judge_status": "ok",
                                "speaker_similarity": float(rng.uniform(0.5, 0.9)),
                                "h1_h2_db": cont[0],
                                "h1_a3_db": cont[1],
                                "cpps_db": cont[2],
                                **judge,
                            }
                        )
    return pd.DataFrame(pm), pd.DataFrame(sc)


def assert_sc_tables(tables: dict[str, pd.DataFrame]) -> None:
    assert_statuses(tables["vq_type3"], ["f_value", "p_value"])
    assert_statuses(tables["vq_contrasts"], ["estimate", "se", "ci_low", "ci_high"])
    assert_statuses(tables["vq_fits"], [])
    assert_statuses(tables["retention"], ["retention", "ci_low", "ci_high"])
    assert_statuses(tables["judge_beta_fits"], ["llf"])
    assert_statuses(tables["judge_beta_coefficients"], ["estimate", "se"])


@SETTINGS
@given(tables=sc_tables())
def test_sc_never_raises(tables):
    from voicebias.analysis.sc import analyse

    pm, sc = tables
    assert_sc_tables(analyse(sc, pm, n_boot=20))


def test_sc_on_an_empty_table():
    from voicebias.analysis.sc import analyse

    pm = pd.DataFrame(
        columns=[
            "stimulus_id",
            "prompt_id",
            "voice_gender",
            "voice_id",
            "phonation",
            "measure_status",
            "h1_h2_db_whole",
            "h1_a3_db_whole",
            "cpps_db_whole",
        ]
    )
    sc = pd.DataFrame(
        columns=[
            "stimulus_id",
            "prompt_id",
            "voice_gender",
            "voice_id",
            "phonation",
            "system",
            "lang",
            "status",
            "measure_status",
            "judge_status",
            "speaker_similarity",
            "h1_h2_db",
            "h1_a3_db",
            "cpps_db",
            *DIMS,
        ]
    )
    assert_sc_tables(analyse(sc, pm, n_boot=20))


# ------------------------------------------------------------------ disaggregated table and the stages


@SETTINGS
@given(describe=s2s_tables("describe"), summarize=s2s_tables("summarize"), acoustic=acoustic_tables(), sc=sc_tables())
def test_disaggregated_never_raises(describe, summarize, acoustic, sc):
    from voicebias.analysis.disaggregated import disaggregate, s2s_items, sc_items

    scored = pd.concat(
        [describe.drop(columns=["sample"], errors="ignore"), summarize.drop(columns=["sample"], errors="ignore")],
        ignore_index=True,
    )
    items = pd.concat([s2s_items(scored, acoustic), sc_items(sc[1])], ignore_index=True)
    table = disaggregate(items, resamples=50)
    assert_statuses(table, ["estimate", "ci_low", "ci_high"])


@settings(SETTINGS, max_examples=6)
@given(describe=s2s_tables("describe"), acoustic=acoustic_tables())
@example(
    describe=separated_table(),
    acoustic=pd.DataFrame(
        columns=[
            "system",
            "task",
            "status",
            "lang",
            "pole",
            "voice_gender",
            "passage_id",
            "stimulus_id",
            "delta_composite",
            "delta_f0_median_st",
        ]
    ),
)
def test_analysis_stage_never_raises(describe, acoustic):
    """The analysis stage itself (its tables, metrics and planted-truth files) on degenerate tables."""
    from voicebias.io import read_table, write_table
    from voicebias.pipeline.analysis import run_stage

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scored = describe.assign(system="sys")
        write_table(tmp / "scored.csv", scored)
        write_table(tmp / "acoustic.csv", acoustic)
        run_stage(
            {"analyze": {"confidence": 0.95}},
            scored_paths=[tmp / "scored.csv"],
            out_dir=tmp / "out",
            acoustic_paths=[tmp / "acoustic.csv"] if len(acoustic) else None,
        )
        odds = read_table(tmp / "out" / "describe_odds_ratios.csv")
        assert set(odds["status"].dropna()) <= set(STATUSES)
