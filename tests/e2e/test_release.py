"""`voicebias release` then `voicebias replicate`: a bundle a stranger re-derives without calling any
system, every table passing; one edited reply is named, with the tables it changes, and exits 1."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from tests.support.workspace import sh
from voicebias.cli.release import MANIFEST, _sha256


def test_a_release_replicates_from_its_replies_and_an_edited_reply_is_named(workspace, tmp_path):
    _, repo, _ = workspace
    bundle = tmp_path / "bundle"
    sh(f"voicebias release {bundle}", cwd=repo)
    manifest = json.loads((bundle / MANIFEST).read_text())
    assert "data/responses/voice_faithful/describe/responses.csv" in manifest["files"]
    assert "reports/report/audit_card.json" in manifest["files"]
    sheet = (bundle / "DATASHEET.md").read_text()
    assert "## Motivation" in sheet and "## Maintenance" in sheet and "Datasheets for Datasets" in sheet

    # replicated away from the checkout: nothing but the bundle is read, and no system is built
    ok = sh(f"voicebias replicate {bundle}", cwd=tmp_path)
    lines = [x for x in ok.stdout.splitlines() if x.startswith(("PASS", "FAIL"))]
    assert lines and all(x.startswith("PASS") for x in lines), ok.stdout
    assert any("reports/analysis/describe_odds_ratios.csv" in x for x in lines)
    assert any("audit_card.json" in x for x in lines)
    # the reference systems are none of the S2S paper's: no published figure applies, and it says so
    assert "audits none of the paper's five systems" in ok.stdout

    # one describe reply edited ("female" to "male"), the manifest updated to hide it
    edited = tmp_path / "edited"
    shutil.copytree(bundle, edited)
    table = edited / "data" / "responses" / "mixed" / "describe" / "responses.csv"
    df = pd.read_csv(table, dtype=str, keep_default_na=False)
    i = next(i for i, t in enumerate(df["transcript"]) if "female" in t.lower())
    df.loc[i, "transcript"] = df.loc[i, "transcript"].lower().replace("female", "male")
    df.to_csv(table, index=False)
    bad = sh(f"voicebias replicate {edited}", cwd=tmp_path, check=False)
    assert bad.returncode == 1
    failed = [x for x in bad.stdout.splitlines() if x.startswith("FAIL")]
    assert any("data/responses/mixed/describe/responses.csv" in x for x in failed)  # the file named
    assert any("data/scored/mixed.csv" in x for x in failed)
    assert any("reports/analysis/describe_misgender.csv" in x for x in failed)
    # with the manifest rewritten to match, the derived tables still name the change
    m = json.loads((edited / MANIFEST).read_text())
    m["files"]["data/responses/mixed/describe/responses.csv"] = _sha256(table)
    (edited / MANIFEST).write_text(json.dumps(m))
    bad = sh(f"voicebias replicate {edited}", cwd=tmp_path, check=False)
    failed = [x for x in bad.stdout.splitlines() if x.startswith("FAIL")]
    assert bad.returncode == 1 and not any(x.startswith("FAIL  files") for x in failed)
    assert any("data/scored/mixed.csv" in x for x in failed)
