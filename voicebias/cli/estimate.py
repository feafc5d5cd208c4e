"""`voicebias preflight --estimate`: the calls, audio, tokens and cost a profile would send, before
anything is sent.

The calls are counted from the profile itself, as the stages would make them: the passages of
the profile's languages in the bank (each read once in a male and once in a female voice), every
task over the stimuli in its languages, `run.samples_per_item` answers each; the continuum's steps
(`continuum`: passages per pole x poles x languages x 2 base voices x steps) for its tasks; the
whole-run replicates (`replicates`: `run.replicates` - 1 more runs of `run.replicate_tasks`); and,
for the continuation systems, the stimuli of this workspace's phonation manifest (when there is
one: the SC stimuli depend on files the profile names, so they are counted once made).

The input audio is the stimuli's duration: measured in this workspace's stimulus manifest for the
passages it holds (`basis` says so: another TTS voice reads at another rate), else the passage's
length at `tts.rate_wpm` (words, or characters for Chinese, per minute).

Tokens come from one of two bases, said in the output, and are never invented:

- `measured`: the replies of this system already in this workspace (reports/usage/calls.csv):
  input audio tokens per second of input, and text tokens in and audio and text tokens out per
  call (per task where the task has measured calls);
- `card`: the card's `pricing.audio_tokens_per_second` (input audio only; the reply side stays
  unknown).

With neither, tokens and cost are "unknown". The cost prices the estimated tokens with the card's
dated price table (voicebias.cost.call_cost on the totals); a kind it prices that is unknown leaves
the cost unknown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.cost import PRICED_KINDS, call_cost

#: the columns of :func:`estimate`
ESTIMATE_COLUMNS = [
    "system",
    "part",
    "task",
    "calls",
    "input_audio_s",
    "input_basis",
    *[f"{k}_tokens" for k in PRICED_KINDS],
    "token_basis",
    "cost",
    "currency",
    "price_date",
]


def _stimulus_seconds(params: dict[str, Any], root: Path) -> pd.DataFrame:
    """One row per stimulus the profile would make (lang, passage_id, pole, seconds, basis)."""
    from voicebias.stimuli.bank import load_bank

    passages = load_bank(root / params["bank"]["dir"], params["base"]["languages"])
    rate = float(params["tts"]["rate_wpm"])
    passages["seconds"] = passages["length_units"] / rate * 60.0
    passages["basis"] = f"input durations from the passages' length at tts.rate_wpm {rate:g}"
    manifest = root / "data" / "stimuli" / "manifest.csv"
    measured: dict[tuple[str, str], float] = {}
    if manifest.exists():
        m = pd.read_csv(manifest, usecols=["passage_id", "lang", "duration_s"], dtype={"passage_id": str})
        measured = m.groupby(["lang", "passage_id"])["duration_s"].mean().to_dict()
    keys = list(zip(passages["lang"], passages["passage_id"].astype(str)))
    has = [k in measured for k in keys]
    passages.loc[has, "seconds"] = [measured[k] for k, h in zip(keys, has) if h]
    backend = root / "data" / "stimuli" / "backend.json"
    voiced_by = ""
    if backend.exists():
        from voicebias.io import read_json

        voiced_by = f", voiced by {read_json(backend).get('backend', 'an unnamed backend')}"
    passages.loc[has, "basis"] = f"input durations measured in this workspace's data/stimuli/manifest.csv{voiced_by}"
    return pd.concat([passages.assign(voice_gender=g) for g in ("male", "female")], ignore_index=True)


def plan(params: dict[str, Any], root: Path) -> pd.DataFrame:
    """The calls of the profile: one row per system x part x task with calls, input_audio_s and
    input_basis."""
    from voicebias.params import replicate_tasks, samples_per_item
    from voicebias.tasks import load_tasks

    samples = samples_per_item(params)
    stimuli = _stimulus_seconds(params, root)
    tasks = load_tasks()
    rows = []

    def add(system: str, part: str, task: str, chosen: pd.DataFrame, per: int) -> None:
        basis = "; ".join(sorted(set(chosen["basis"]))) if len(chosen) else "–"
        rows.append(
            {
                "system": system,
                "part": part,
                "task": task,
                "calls": int(len(chosen) * per),
                "input_audio_s": round(float(chosen["seconds"].sum() * per), 1),
                "input_basis": basis,
            }
        )

    cont = params.get("continuum") or {}
    continuum = pd.DataFrame()
    if cont.get("enabled"):
        picked = []
        for lang in cont["languages"]:
            for pole in cont["poles"]:
                mine = stimuli[(stimuli["lang"] == lang) & (stimuli["pole"] == pole)]
                ids = sorted(mine["passage_id"].astype(str).unique())[: int(cont["passages_per_pole"])]
                picked.append(mine[mine["passage_id"].astype(str).isin(ids)])
        continuum = pd.concat(picked, ignore_index=True) if picked else continuum
    extra_runs = int(params["run"].get("replicates", 1)) - 1
    for system in params["run"]["systems"]:
        for name in params["tasks"]["names"]:
            langs = tasks[name].languages()
            add(system, "s2s", name, stimuli[stimuli["lang"].isin(langs)] if langs else stimuli, samples)
        for name in replicate_tasks(params):  # the whole-run replicates: the same requests again, per extra run
            langs = tasks[name].languages()
            chosen = stimuli[stimuli["lang"].isin(langs)] if langs else stimuli
            add(system, "replicates", name, chosen, samples * extra_runs)
        if len(continuum):
            for name in cont["tasks"]:
                add(system, "continuum", name, continuum, int(cont["steps"]))
    phon = root / "data" / "phonation" / "manifest.csv"
    for system in params["run"].get("sc_systems") or []:
        if phon.exists():
            m = pd.read_csv(phon, usecols=["duration_s"])
            add(
                system,
                "sc",
                "continue",
                pd.DataFrame({"seconds": m["duration_s"], "basis": "this workspace's data/phonation/manifest.csv"}),
                1,
            )
        else:
            rows.append(
                {
                    "system": system,
                    "part": "sc",
                    "task": "continue",
                    "calls": None,
                    "input_audio_s": None,
                    "input_basis": "counted once `dvc repro phonation` has made the SC stimuli",
                }
            )
    return pd.DataFrame(rows)


def measured_rates(calls: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per task (and "ALL"): input audio tokens per input second, and the other priced kinds per
    call, over the calls that report each kind. Empty without such calls."""
    out: dict[str, dict[str, float]] = {}
    for task, g in [("ALL", calls), *calls.groupby("task")]:
        rates: dict[str, float] = {}
        audio = g[g["input_audio_tokens"].notna() & (pd.to_numeric(g["input_audio_s"]) > 0)]
        if len(audio):
            rates["input_audio_per_s"] = float(audio["input_audio_tokens"].sum() / audio["input_audio_s"].sum())
        for kind in ("input_text", "output_text", "output_audio"):
            col = g[f"{kind}_tokens"].dropna()
            if len(col):
                rates[f"{kind}_per_call"] = float(col.mean())
        rates["n"] = float(len(g))
        if len(rates) > 1:
            out[str(task)] = rates
    return out


def estimate(params: dict[str, Any], root: Path, cards_dir: Path | None = None) -> pd.DataFrame:
    """:func:`plan` with the tokens and cost of each row (:data:`ESTIMATE_COLUMNS`)."""
    from voicebias.cards import load_card

    cards_dir = cards_dir or root / "models" / "cards"
    table = plan(params, root)
    calls_path = root / "reports" / "usage" / "calls.csv"
    history = pd.read_csv(calls_path) if calls_path.exists() else None
    out = []
    for r in table.to_dict("records"):
        card = load_card(r["system"], cards_dir)
        pricing = card.get("pricing")
        counts: dict[str, float | None] = {k: None for k in PRICED_KINDS}
        basis = "unknown: no reply of this system here and no pricing.audio_tokens_per_second in its card"
        mine = history[history["system"] == r["system"]] if history is not None else None
        rates = measured_rates(mine) if mine is not None and len(mine) else {}
        if r["calls"] is not None and rates:
            rate = rates.get(r["task"]) or rates["ALL"]
            counts["input_audio"] = (
                rate["input_audio_per_s"] * r["input_audio_s"] if "input_audio_per_s" in rate else None
            )
            for kind in ("input_text", "output_text", "output_audio"):
                per = rate.get(f"{kind}_per_call")
                counts[kind] = per * r["calls"] if per is not None else None
            which = r["task"] if r["task"] in rates else "all tasks"
            basis = f"measured on {int(rate['n'])} earlier calls of this system ({which})"
        elif r["calls"] is not None and pricing and (pricing.get("audio_tokens_per_second") or {}).get("input"):
            counts["input_audio"] = pricing["audio_tokens_per_second"]["input"] * r["input_audio_s"]
            basis = "card: pricing.audio_tokens_per_second (the reply side unknown)"
        if r["calls"] is None:
            basis = "–"
        rounded = {k: (None if v is None else round(v)) for k, v in counts.items()}
        cost = call_cost(rounded, pricing)
        out.append(
            {
                **r,
                **{f"{k}_tokens": rounded[k] for k in PRICED_KINDS},
                "token_basis": basis,
                "cost": None if cost is None else round(cost, 2),
                "currency": pricing["currency"] if pricing else None,
                "price_date": pricing["date"] if pricing else None,
            }
        )
    return pd.DataFrame(out, columns=ESTIMATE_COLUMNS)


def format_estimate(table: pd.DataFrame, profile: str) -> str:
    """The estimate as the command prints it: per system, its total, then one line per part x task."""

    def n(v: Any, unit: str = "") -> str:
        return "unknown" if v is None or pd.isna(v) else f"{v:,.0f}{unit}"

    lines = [f"Estimate for profile '{profile}' (nothing is sent; docs/cost.md says how it is made)"]
    for system, g in table.groupby("system", sort=False):
        known = g["calls"].notna()
        cost = g["cost"]
        total_cost = (
            f"{cost.sum():,.2f} {g['currency'].iloc[0]} (prices of {g['price_date'].iloc[0]})"
            if cost.notna().all() and g["currency"].notna().all()
            else "unknown"
            if g["currency"].notna().any()
            else "no price table in the card"
        )
        lines.append(
            f"\n{system}: {n(g.loc[known, 'calls'].sum())} calls, "
            f"{n(g.loc[known, 'input_audio_s'].sum() / 60)} min of input audio; cost {total_cost}"
        )
        for r in g.to_dict("records"):
            known_kinds = [k for k in PRICED_KINDS if r[f"{k}_tokens"] is not None and not pd.isna(r[f"{k}_tokens"])]
            tok = (
                "tokens: " + ", ".join(f"{k.replace('_', ' ')} {n(r[f'{k}_tokens'])}" for k in known_kinds)
                if known_kinds
                else "tokens unknown"
            )
            lines.append(
                f"  {r['part']:<10} {r['task']:<10} {n(r['calls']):>7} calls  {n(r['input_audio_s'], ' s'):>10} in"
                f"  {tok}"
                + (f"; {r['cost']:,.2f} {r['currency']}" if r["cost"] is not None and not pd.isna(r["cost"]) else "")
            )
        bases = sorted(set(g["input_basis"]) | set(g["token_basis"]) - {"–"})
        lines += [f"  basis: {b}" for b in bases]
    return "\n".join(lines)
