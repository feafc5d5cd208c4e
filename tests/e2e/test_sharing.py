"""Compare, read and share: MLflow over its REST API, an S3 remote, the report in a browser.

Servers run on 127.0.0.1 only: the MLflow tracking server on the workspace's
mlflow.db and moto's S3-compatible server for the DVC remote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.support.servers import free_port, mlflow_server_cmd, post_json
from tests.support.workspace import BIN, sh, tree_hashes


def test_mlflow_rest_api_returns_the_reported_numbers(workspace, server):
    _, repo, _ = workspace
    port = free_port()
    server(
        mlflow_server_cmd(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}", port), f"http://127.0.0.1:{port}/health", repo
    )
    run = json.loads((repo / "mlruns" / "last_run.json").read_text())
    found = post_json(
        f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search",
        {
            "experiment_ids": [run["experiment_id"]],
            "max_results": 1000,
            "filter": f"tags.mlflow.parentRunId = '{run['parent_run_id']}'",
        },
    )
    runs = found["runs"]
    assert len(runs) == len(run["children"])
    odds = pd.read_csv(repo / "reports" / "analysis" / "describe_odds_ratios.csv")
    rates = pd.read_csv(repo / "reports" / "analysis" / "describe_misgender.csv")
    psy = pd.read_csv(repo / "reports" / "psychometric" / "psychometric.csv")
    usage = pd.read_csv(repo / "reports" / "usage" / "usage.csv")
    checked, continuum, used = 0, 0, 0
    for r in runs:
        tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
        metrics = {m["key"]: m["value"] for m in r["data"].get("metrics", [])}
        slope = psy[
            (psy["system"] == tags.get("system"))
            & (psy["lang"] == tags.get("lang"))
            & (psy["task"] == tags.get("task"))
            & (psy["quantity"] == "slope")
        ]
        if len(slope) and pd.notna(slope.iloc[0]["estimate"]):  # the voice continuum's fit
            assert metrics["psychometric/slope_per_st"] == pytest.approx(slope.iloc[0]["estimate"], rel=1e-9)
            continuum += 1
        u = usage[(usage["system"] == tags.get("system")) & (usage["task"] == tags.get("task"))]
        u = u[u["part"] != "continuum"]
        if tags.get("lang") == "ALL" and len(u):  # what the system x task's calls used
            assert metrics["usage/calls"] == u.iloc[0]["calls"]
            assert metrics["usage/input_audio_s"] == pytest.approx(u.iloc[0]["input_audio_s"], rel=1e-9)
            used += 1
        if tags["task"] != "describe":
            continue
        o = odds[(odds["system"] == tags["system"]) & (odds["lang"] == tags["lang"])]
        if len(o) and o.iloc[0]["fit_status"] == "ok":
            assert metrics["describe/odds_ratio"] == pytest.approx(o.iloc[0]["odds_ratio"], rel=1e-9)
            checked += 1
        m = rates[
            (rates["system"] == tags["system"]) & (rates["lang"] == tags["lang"]) & (rates["cell_type"] == "misaligned")
        ]
        if len(m) and pd.notna(m.iloc[0]["rate"]):
            assert metrics["describe/misgender_rate/misaligned"] == pytest.approx(m.iloc[0]["rate"], rel=1e-9)
            checked += 1
    assert checked >= 8
    # every continuum fit with an estimate is readable; the reduced workspace's continuum has one
    # passage per pole, so some of its fits have none
    assert continuum >= 1
    assert used >= len(set(usage["system"]))
    # the parent carries each system's totals
    parent = post_json(
        f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [run["experiment_id"]], "filter": f"attributes.run_id = '{run['parent_run_id']}'"},
    )["runs"][0]
    pm = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
    for r in usage[usage["part"] == "ALL"].itertuples():
        assert pm[f"usage/{r.system}/calls"] == r.calls


def test_s3_remote_round_trip_is_byte_identical(workspace, server, tmp_path, monkeypatch):
    base, repo, _ = workspace
    port = free_port()
    server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], f"http://127.0.0.1:{port}/", repo)
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for k, v in creds.items():  # restored (or removed) after the test, whatever was set before
        monkeypatch.setenv(k, v)
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="voicebias-share")
        sh("dvc remote add s3share s3://voicebias-share/store", repo)
        sh(f"dvc remote modify s3share endpointurl http://127.0.0.1:{port}", repo)
        # commit the workspace as it is, so the clone's dvc.lock names exactly what is pushed
        sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm 's3 remote'", repo)
        sh("dvc push -r s3share", repo)
        clone = tmp_path / "s3clone"
        sh(f"git clone -q {repo} {clone}", tmp_path)
        sh("dvc pull -r s3share", clone)
        for sub in ("data/stimuli", "data/responses", "data/scored", "data/measures", "data/passages"):
            assert tree_hashes(clone, sub) == tree_hashes(repo, sub) and tree_hashes(repo, sub)
    finally:
        sh("dvc remote remove s3share", repo, check=False)


def test_report_renders_in_headless_chromium(workspace, tmp_path):
    _, repo, _ = workspace
    chromium, driver = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
    if not (chromium.exists() and driver.exists()):
        pytest.fail(
            "Debian's chromium and chromium-driver are missing: .ci/run installs them "
            "(apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(chromium)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,3000",
    ):
        opts.add_argument(flag)
    browser = webdriver.Chrome(service=Service(str(driver)), options=opts)
    try:
        browser.get((repo / "reports" / "report" / "report.html").as_uri())
        broken = browser.execute_script(
            "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
        )
        n_images = browser.execute_script("return document.images.length")
        empty_tables = browser.execute_script(
            "return Array.from(document.querySelectorAll('table'))"
            ".filter(t => t.querySelectorAll('tbody tr').length === 0).length"
        )
        n_tables = browser.execute_script("return document.querySelectorAll('table').length")
        continuum_figure = browser.execute_script(
            "return Array.from(document.images).filter(i => i.src.endsWith('psychometric.png') && i.naturalWidth > 0)"
            ".length"
        )
        page_text = browser.execute_script("return document.body.innerText")
        # readable at a normal window width: the page itself never scrolls sideways (a wide table scrolls in its box)
        page_width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        unwrapped = browser.execute_script(
            "return Array.from(document.querySelectorAll('table')).filter(t => !t.parentElement.classList"
            ".contains('table-wrap')).length"
        )
        shot = tmp_path / "report.png"
        browser.save_screenshot(str(shot))
    finally:
        browser.quit()
    assert broken == [] and n_images >= 3
    assert continuum_figure == 1 and "Voice continuum and psychometric functions" in page_text
    assert "voice continuum (describe)" in page_text
    assert n_tables >= 7 and empty_tables == 0
    assert page_width[0] <= page_width[1] and unwrapped == 0, page_width
    assert shot.stat().st_size > 20_000
