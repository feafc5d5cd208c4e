"""Counted exclusions: every reply that did not enter an analysis, by stage and reason.

Nothing a system sent is dropped silently. A reply leaves the analyses at one of three places
(respond: a failed call or the reply screen; scoring: a non-compliant describe answer;
acoustic_scoring: audio the instrument cannot measure), each giving it a reason code, and is counted
once, at the first place that excludes it. `planted_exclusions` turns a reference system's planted
faults into the reasons they must get, so the audit can show that every planted fault was excluded
with the right reason and nothing else was.

The stages and their reason codes: docs/analysis.md, "Counted exclusions".
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pandas as pd

from voicebias.contract import CALL_FAILED, SAMPLE
from voicebias.errors import StageFailed

EXCLUSION_COLUMNS = ["system", "task", "lang", "stage", "reason", "n"]
STAGES = ("respond", "scoring", "acoustic_scoring")
NON_COMPLIANT = "non_compliant"


def _keys(df: pd.DataFrame) -> list[str]:
    return ["task", "stimulus_id", *([SAMPLE] if SAMPLE in df.columns else [])]


def excluded_replies(scored: pd.DataFrame, acoustic: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per excluded reply: system, task, lang, stimulus_id (sample), stage, reason.

    Parameters
    ----------
    scored : DataFrame
        Text-scored responses (data/scored/<system>.csv): status (ok, failed, excluded),
        reason (for excluded rows), task, judged_gender.
    acoustic : DataFrame, optional
        Acoustic scores (data/scored/<system>_acoustics.csv): status and reason per output.

    Returns
    -------
    DataFrame
        The excluded replies, in the order of `scored` then `acoustic`.

    Examples
    --------
    >>> import pandas as pd
    >>> scored = pd.DataFrame({"system": "s", "task": ["describe"] * 3 + ["readback"] * 2, "lang": "en",
    ...                        "stimulus_id": list("abcde"),
    ...                        "status": ["ok", "excluded", "failed", "ok", "ok"],
    ...                        "reason": [None, "refusal", None, None, None],
    ...                        "judged_gender": ["none", None, None, None, None]})
    >>> acoustic = pd.DataFrame({"system": "s", "task": "readback", "lang": "en", "stimulus_id": ["d", "e"],
    ...                          "status": ["excluded", "ok"], "reason": ["no_voicing", None]})
    >>> print(excluded_replies(scored, acoustic).to_string(index=False))
    system     task lang stimulus_id            stage        reason
         s describe   en           a          scoring non_compliant
         s describe   en           b          respond       refusal
         s describe   en           c          respond   call_failed
         s readback   en           d acoustic_scoring    no_voicing
    """
    keys = _keys(scored)
    cols = ["system", "task", "lang", *keys[1:], "stage", "reason"]
    reason = scored["reason"] if "reason" in scored.columns else pd.Series(None, index=scored.index, dtype=object)
    status = scored["status"]
    judged = scored["judged_gender"] if "judged_gender" in scored.columns else pd.Series(None, index=scored.index)
    stage = np.select(
        [
            status == "failed",
            status == "excluded",
            (status == "ok") & (scored["task"] == "describe") & (judged == "none"),
        ],
        ["respond", "respond", "scoring"],
        default="",
    )
    why = np.select(
        [status == "failed", status == "excluded", stage == "scoring"],
        [reason.fillna(CALL_FAILED).astype(str), reason.fillna("unknown").astype(str), NON_COMPLIANT],
        default="",
    )
    text = scored.assign(stage=stage, reason=why)
    text = text[text["stage"] != ""]
    parts = [text[cols]]
    if acoustic is not None and len(acoustic) and "status" in acoustic.columns:
        # matched on the keys both tables have (a table of repeats has a sample column, one without does not)
        on = ["system", *[k for k in keys if k in acoustic.columns]]
        usable = scored.loc[status == "ok", list(dict.fromkeys([*on, *keys, "lang"]))]
        ac = acoustic[acoustic["status"] == "excluded"]
        ac = ac[[c for c in ac.columns if c in on or c not in usable.columns]].merge(usable, on=on, how="inner")
        ac = ac.assign(
            stage="acoustic_scoring",
            reason=(ac["reason"] if "reason" in ac.columns else pd.Series("unknown", index=ac.index))
            .fillna("unknown")
            .astype(str),
        )
        parts.append(ac[cols])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def exclusion_counts(scored: pd.DataFrame, acoustic: pd.DataFrame | None = None) -> pd.DataFrame:
    """Excluded replies counted by system x task x language x stage x reason (EXCLUSION_COLUMNS),
    sorted; a system with no exclusion has no row.

    Examples
    --------
    >>> import pandas as pd
    >>> scored = pd.DataFrame({"system": "s", "task": "describe", "lang": "en", "stimulus_id": list("abc"),
    ...                        "status": ["excluded", "excluded", "ok"], "reason": ["silent", "silent", None],
    ...                        "judged_gender": [None, None, "male"]})
    >>> print(exclusion_counts(scored).to_string(index=False))
    system     task lang   stage reason  n
         s describe   en respond silent  2
    """
    rows = excluded_replies(scored, acoustic)
    if rows.empty:
        return pd.DataFrame(columns=EXCLUSION_COLUMNS)
    out = rows.groupby(["system", "task", "lang", "stage", "reason"], sort=True).size().rename("n").reset_index()
    return out[EXCLUSION_COLUMNS]


def planted_fault_of(provenance: object) -> str | None:
    """The `planted_fault` of a responses row's provenance JSON, or None."""
    if not isinstance(provenance, str) or "planted_fault" not in provenance:
        return None
    try:
        return json.loads(provenance).get("planted_fault")
    except ValueError:
        return None


def planted_exclusions(scored: pd.DataFrame, planted: Mapping[str, Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """The exclusions the planted faults must give: system, task, lang, reason, planted (count).

    A reference system records the fault it planted in a reply in that reply's provenance;
    its planted truth (`planted[system]["fault_reasons"]`, recorded by the respond stage) names
    the reason each fault must get. Replies whose call failed are left out (their fault was
    never seen). Empty when nothing was planted.
    """
    cols = ["system", "task", "lang", "reason", "planted"]
    if "provenance" not in scored.columns:
        return pd.DataFrame(columns=cols)
    reasons = {s: dict(t.get("fault_reasons") or {}) for s, t in (planted or {}).items()}
    fault = scored["provenance"].map(planted_fault_of)
    reason = [reasons.get(s, {}).get(f) if isinstance(f, str) else None for s, f in zip(scored["system"], fault)]
    unnamed = sorted({(s, f) for s, f, r in zip(scored["system"], fault, reason) if isinstance(f, str) and r is None})
    if unnamed:
        raise StageFailed(
            f"replies record planted faults their system's planted truth gives no reason for (system, fault): {unnamed}"
        )
    rows = scored.assign(reason=reason)[fault.notna() & (scored["status"] != "failed")]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    return rows.groupby(["system", "task", "lang", "reason"], sort=True).size().rename("planted").reset_index()[cols]


def exclusions_vs_planted(counts: pd.DataFrame, planted: pd.DataFrame) -> pd.DataFrame:
    """Planted against recovered exclusions per system x reason (tasks and languages pooled), for
    the systems with planted faults: quantity ``excluded_<reason>``, planted and recovered counts,
    and recovered_ok when they are equal (an exact count: no interval). Reasons that were not
    planted but occur (a well-formed reply excluded) are rows with planted 0, so they fail too.
    Non-compliant describe answers and failed calls are left out: they are not planted faults."""
    cols = ["system", "quantity", "planted", "recovered", "recovered_ok"]
    if planted.empty:
        return pd.DataFrame(columns=cols)
    systems = set(planted["system"])
    got = counts[counts["system"].isin(systems) & ~counts["reason"].isin([CALL_FAILED, NON_COMPLIANT])]
    p = planted.groupby(["system", "reason"])["planted"].sum()
    r = got.groupby(["system", "reason"])["n"].sum()
    index = sorted(set(p.index) | set(r.index))
    rows = [
        {
            "system": s,
            "quantity": f"excluded_{reason}",
            "planted": int(p.get((s, reason), 0)),
            "recovered": int(r.get((s, reason), 0)),
        }
        for s, reason in index
    ]
    out = pd.DataFrame(rows, columns=cols[:-1])
    out["recovered_ok"] = out["planted"] == out["recovered"]
    return out[cols]
