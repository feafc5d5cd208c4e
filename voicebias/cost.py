"""What the calls of a run used and cost: audio seconds, tokens by kind and money.

Every adapter keeps the usage the server reported in the reply's provenance (`usage`, as the
server sent it), and every response table keeps the provenance per call. From those tables and
the stimulus manifests this module builds, per call, the input and output audio seconds and the
tokens by kind (:func:`usage_table`), prices them with the system card's dated price table
(:func:`validate_pricing`, :func:`call_cost`) and sums them per system and task
(:func:`usage_totals`), with the model ids the servers returned and their fingerprints, so a run
says which model answered it. `voicebias preflight --estimate` (:func:`estimate`) prints the calls,
audio, tokens and cost a profile would send before anything is sent.

Token kinds (:data:`TOKEN_KINDS`): input text, input audio, output text and output audio, the four
kinds audio APIs price apart, plus cached input and reasoning tokens where the server reports
them (counted, not priced apart). Servers report usage in two shapes, both read here:

- OpenAI and OpenAI-compatible servers (vLLM, vLLM-Omni): `prompt_tokens`, `completion_tokens`,
  and `prompt_tokens_details` / `completion_tokens_details` with `text_tokens`, `audio_tokens`,
  `cached_tokens`, `reasoning_tokens`;
- Gemini: `prompt_token_count`, `response_token_count`, `cached_content_token_count`,
  `thoughts_token_count`, and `prompt_tokens_details` / `response_tokens_details` as lists of
  {modality, token_count}.

A reply that gives only the totals has unknown kinds; a reply that gives the audio tokens but not
the text tokens has its text tokens taken as the rest of the total. A call whose priced kinds are
not all known is left unpriced (counted), never guessed. The design: docs/cost.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from voicebias.errors import ConfigError

#: the token kinds priced apart (per million tokens in a card's `pricing.per_million_tokens`)
PRICED_KINDS = ("input_text", "input_audio", "output_text", "output_audio")
#: every token kind a call records; cached input and reasoning tokens are counted, not priced apart
TOKEN_KINDS = (*PRICED_KINDS, "input_cached", "output_reasoning")
#: the per-call columns of :func:`usage_table`
USAGE_COLUMNS = [
    "part",
    "system",
    "task",
    "stimulus_id",
    "sample",
    "cache_key",
    "status",
    "input_audio_s",
    "output_audio_s",
    "input_tokens",
    "output_tokens",
    *[f"{k}_tokens" for k in TOKEN_KINDS],
    "cost",
    "model_id",
    "fingerprint",
]
#: the numeric totals of :func:`usage_totals` (the card keeps them, MLflow logs them as metrics)
TOTAL_COUNTS = (
    "calls",
    "calls_with_usage",
    "input_audio_s",
    "output_audio_s",
    "input_tokens",
    "output_tokens",
    "input_text_tokens",
    "input_audio_tokens",
    "output_text_tokens",
    "output_audio_tokens",
    "priced_calls",
    "cost",
)
#: the keys of a card's `pricing`
PRICING_KEYS = ("currency", "per_million_tokens", "source", "date", "audio_tokens_per_second", "note")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_URL = re.compile(r"^https?://\S+$")


def _count(v: Any) -> int | None:
    """A token count as an int; None for a missing, negative or non-numeric value."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f) or f < 0:
        return None
    return int(round(f))


def _modalities(details: Any) -> dict[str, int]:
    """Gemini's [{modality, token_count}] as {modality (lower case): tokens}."""
    out: dict[str, int] = {}
    for d in details if isinstance(details, list) else []:
        if isinstance(d, Mapping):
            n = _count(d.get("token_count"))
            if n is not None:
                key = str(d.get("modality", "")).lower().removeprefix("mediamodality.")
                out[key] = out.get(key, 0) + n
    return out


def _rest(total: int | None, part: int | None) -> int | None:
    return total - part if total is not None and part is not None and total >= part else None


def tokens(usage: Any) -> dict[str, int | None]:
    """The tokens of one reply by kind, from the usage the server reported (either shape; None,
    or a shape not recognised, gives every count None). Keys: input, output and :data:`TOKEN_KINDS`."""
    out: dict[str, int | None] = {"input": None, "output": None, **{k: None for k in TOKEN_KINDS}}
    if not isinstance(usage, Mapping):
        return out
    if "prompt_token_count" in usage or "response_token_count" in usage:  # Gemini
        out["input"] = _count(usage.get("prompt_token_count"))
        out["output"] = _count(usage.get("response_token_count"))
        out["input_cached"] = _count(usage.get("cached_content_token_count"))
        out["output_reasoning"] = _count(usage.get("thoughts_token_count"))
        for side, key in (("input", "prompt_tokens_details"), ("output", "response_tokens_details")):
            mods = _modalities(usage.get(key))
            if mods:
                out[f"{side}_audio"] = mods.get("audio", 0)
                out[f"{side}_text"] = mods.get("text", 0)
        return out
    out["input"] = _count(usage.get("prompt_tokens"))
    out["output"] = _count(usage.get("completion_tokens"))
    for side, key in (("input", "prompt_tokens_details"), ("output", "completion_tokens_details")):
        details = usage.get(key)
        if not isinstance(details, Mapping):
            continue
        audio, text = _count(details.get("audio_tokens")), _count(details.get("text_tokens"))
        if audio is not None and text is None:
            # the rest of the total is text (reasoning tokens are billed as output text)
            text = _rest(out[side], audio)
        out[f"{side}_audio"], out[f"{side}_text"] = audio, text
        if side == "input":
            out["input_cached"] = _count(details.get("cached_tokens"))
        else:
            out["output_reasoning"] = _count(details.get("reasoning_tokens"))
    return out


def validate_pricing(entry: Any, where: str) -> dict[str, Any] | None:
    """A card's `pricing`, checked: `currency` (e.g. USD), `per_million_tokens` ({kind: price} for
    kinds of :data:`PRICED_KINDS`), `source` (the http(s) page the prices were read from) and `date`
    (YYYY-MM-DD, the day they were read); optional `audio_tokens_per_second` ({input, output,
    source}: what one second of audio counts as, for the estimate) and `note`. None when absent."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: 'pricing' must be a mapping (currency, per_million_tokens, source, date)")
    unknown = sorted(set(entry) - set(PRICING_KEYS))
    if unknown:
        raise ConfigError(f"{where}: pricing has unknown key(s) {unknown}; allowed: {', '.join(PRICING_KEYS)}")
    for key in ("currency", "source", "date"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise ConfigError(f"{where}: pricing.{key} is required (a non-empty string)")
    if not _DATE.match(entry["date"]):
        raise ConfigError(
            f"{where}: pricing.date must be the day the prices were read, YYYY-MM-DD, not {entry['date']!r}"
        )
    if not _URL.match(entry["source"]):
        raise ConfigError(f"{where}: pricing.source must be the http(s) address the prices were read from")
    prices = entry.get("per_million_tokens")
    if not isinstance(prices, Mapping) or not prices:
        raise ConfigError(f"{where}: pricing.per_million_tokens must map token kinds to prices per million tokens")
    for kind, price in prices.items():
        if kind not in PRICED_KINDS:
            raise ConfigError(
                f"{where}: pricing.per_million_tokens has unknown kind {kind!r}; kinds: {', '.join(PRICED_KINDS)}"
            )
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
            raise ConfigError(f"{where}: pricing.per_million_tokens.{kind} must be a price >= 0, not {price!r}")
    out = dict(entry)
    out["per_million_tokens"] = {k: float(v) for k, v in prices.items()}
    rate = entry.get("audio_tokens_per_second")
    if rate is not None:
        if not isinstance(rate, Mapping) or not isinstance(rate.get("source"), str) or not _URL.match(rate["source"]):
            raise ConfigError(
                f"{where}: pricing.audio_tokens_per_second needs input and/or output and a source address"
            )
        for side in ("input", "output"):
            v = rate.get(side)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise ConfigError(f"{where}: pricing.audio_tokens_per_second.{side} must be > 0, not {v!r}")
        extra = sorted(set(rate) - {"input", "output", "source"})
        if extra:
            raise ConfigError(f"{where}: pricing.audio_tokens_per_second has unknown key(s) {extra}")
    return out


def call_cost(counts: Mapping[str, int | None], pricing: Mapping[str, Any] | None) -> float | None:
    """The price of one call: its tokens of each priced kind times the card's price per million.
    None without a price table, or when a kind the table prices above 0 is unknown for this call."""
    if not pricing:
        return None
    total = 0.0
    for kind, price in pricing["per_million_tokens"].items():
        n = counts.get(kind)
        if n is None:
            if price > 0:
                return None
            continue
        total += n * price / 1e6
    return total


def usage_table(
    responses: pd.DataFrame,
    durations: Mapping[str, float],
    pricing: Mapping[str, Any] | None,
    part: str,
) -> pd.DataFrame:
    """One row per call of a response table (:data:`USAGE_COLUMNS`): rows that share a cache key
    (one call answered them all) count once, and rows never sent (no attempt) are left out.
    `durations` maps stimulus_id to the stimulus' duration in seconds (its manifest's duration_s)."""
    rows = []
    seen: set[str] = set()
    sample_col = "sample" if "sample" in responses.columns else None
    for r in responses.to_dict("records"):
        key = str(r.get("cache_key"))
        attempts = pd.to_numeric(pd.Series([r.get("attempts")]), errors="coerce").iloc[0]
        if key in seen or not (attempts > 0):
            continue
        seen.add(key)
        try:
            prov = json.loads(r["provenance"]) if isinstance(r.get("provenance"), str) else {}
        except ValueError:
            prov = {}
        counts = tokens(prov.get("usage") if isinstance(prov, Mapping) else None)
        out_s = pd.to_numeric(pd.Series([r.get("output_duration_s")]), errors="coerce").iloc[0]
        rows.append(
            {
                "part": part,
                "system": r["system"],
                "task": r["task"],
                "stimulus_id": r["stimulus_id"],
                "sample": r.get(sample_col) if sample_col else 0,
                "cache_key": key,
                "status": r["status"],
                "input_audio_s": durations.get(str(r["stimulus_id"])),
                "output_audio_s": None if pd.isna(out_s) else float(out_s),
                "input_tokens": counts["input"],
                "output_tokens": counts["output"],
                **{f"{k}_tokens": counts[k] for k in TOKEN_KINDS},
                "cost": call_cost(counts, pricing),
                # which model answered: the id the server returned, and its fingerprint where it gives one
                "model_id": _text(r.get("model_revision")),
                "fingerprint": _text(prov.get("system_fingerprint") if isinstance(prov, Mapping) else None),
            }
        )
    table = pd.DataFrame(rows, columns=USAGE_COLUMNS)
    for col in ["input_tokens", "output_tokens", *[f"{k}_tokens" for k in TOKEN_KINDS]]:
        table[col] = table[col].astype("Int64")
    return table


def usage_totals(calls: pd.DataFrame, pricing: Mapping[str, Any] | None) -> dict[str, Any]:
    """The totals of a set of calls (:func:`usage_table` rows): calls, audio seconds, tokens by kind
    (over the calls that report them, with how many did), cost over the priced calls, and the
    price table's currency, date and source."""
    reported = calls["input_tokens"].notna() | calls["output_tokens"].notna()
    out: dict[str, Any] = {
        "calls": int(len(calls)),
        "calls_with_usage": int(reported.sum()),
        "input_audio_s": round(float(pd.to_numeric(calls["input_audio_s"]).sum()), 3),
        "output_audio_s": round(float(pd.to_numeric(calls["output_audio_s"]).sum()), 3),
    }
    for kind in ("input", "output", *TOKEN_KINDS):
        col = calls[f"{kind}_tokens"]
        out[f"{kind}_tokens"] = int(col.sum()) if col.notna().any() else None
    priced = calls["cost"].notna()
    out["priced_calls"] = int(priced.sum())
    out["cost"] = round(float(calls.loc[priced, "cost"].sum()), 6) if pricing else None
    for col, key in (("model_id", "model_ids"), ("fingerprint", "fingerprints")):
        seen = sorted({str(v) for v in calls[col].dropna()}) if col in calls.columns else []
        out[key] = "; ".join(seen) if seen else None
    out["currency"] = pricing["currency"] if pricing else None
    out["price_date"] = pricing["date"] if pricing else None
    out["price_source"] = pricing["source"] if pricing else None
    return out


def _text(v: Any) -> str | None:
    """A non-empty string, or None (a missing value read from a table is NaN)."""
    return v.strip() if isinstance(v, str) and v.strip() else None


def read_durations(manifests: Iterable[Path]) -> dict[str, float]:
    """stimulus_id -> duration_s over the manifests that exist."""
    out: dict[str, float] = {}
    for path in manifests:
        if Path(path).exists():
            m = pd.read_csv(path, usecols=["stimulus_id", "duration_s"], dtype={"stimulus_id": str})
            out.update(zip(m["stimulus_id"], pd.to_numeric(m["duration_s"], errors="coerce")))
    return out
