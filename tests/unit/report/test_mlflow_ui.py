"""The MLflow UI, in Debian's headless Chromium, opens the pipeline's experiment on its runs table.

`mlflow server` (tests/support/servers.py, 127.0.0.1, a free port) serves the store that
log_pipeline_run fills from the hand-made tables of test_tracking_rest.py. Chromium, with
a fresh profile as a first-time user has, opens the address the tracking stage writes to
last_run.json (`ui_path`, `#/experiments/<id>?workflowType=machine_learning`); the page
must be the runs table: the "Run Name" column, the parent run and, expanded, its
children `content_driven / <lang> / <task>`, and none of the GenAI overview. The
screenshot is saved in tmp_path and, when VOICEBIAS_SCREENSHOT_DIR is set, copied there.

Why the address carries `workflowType`: MLflow 3.17's UI picks an experiment's landing
page from its workflow type (the URL's `workflowType`, else the GenAI / Model training
switch saved in the browser, GenAI by default) and not from the experiment's
`mlflow.experimentKind` tag. The bare address `#/experiments/<id>` therefore opens the
GenAI overview ("Traces 0", "No data available for the selected time range") for the
pipeline's experiment, tag and all, just as for an experiment created without the tag;
the test checks both, which also shows that it tells the overview from the runs table.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.hand_made import SYSTEM, hand_made_store
from tests.support.servers import free_port, mlflow_server_cmd

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
)
WAIT_S = 90  # the UI is a React app that loads its chunks and then queries the server
OVERVIEW = "No data available for the selected time range"  # the GenAI overview's empty charts
CHILDREN = sorted(
    [f"{SYSTEM} / {lang} / {task}" for lang in ("en", "es") for task in ("describe", "summarize", "readback")]
    + [f"{SYSTEM} / ALL / describe", f"{SYSTEM} / ALL / summarize"]
)


def chromium(profile: Path):
    """Debian's headless Chromium through its chromedriver; a clear failure (never a skip) without them."""
    missing = [str(p) for p in (CHROMIUM, DRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(str(DRIVER)), options=opts)


def run_name(browser, name: str):
    """The run-name link of the runs table's row `name`, once it is shown, else None."""
    from selenium.webdriver.common.by import By

    found = [
        e
        for e in browser.find_elements(By.XPATH, f"//div[@role='gridcell']//a[span[text()='{name}']]")
        if e.is_displayed()
    ]
    return found[0] if found else None


def body(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text


def test_the_ui_opens_the_experiment_on_its_runs_table_with_parent_and_children(tmp_path, server, monkeypatch):
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store, _, summary = hand_made_store(tmp_path)
    last = json.loads((tmp_path / "mlruns" / "last_run.json").read_text())
    assert (
        last["ui_path"]
        == summary["ui_path"]
        == (f"#/experiments/{summary['experiment_id']}?workflowType=machine_learning")
    )
    client = MlflowClient(store)  # the negative control: an experiment without the kind tag, one run
    plain = client.create_experiment("no kind tag", artifact_location=(tmp_path / "mlruns" / "artifacts").as_uri())
    client.set_terminated(client.create_run(plain, run_name="untagged-run").info.run_id)
    assert "mlflow.experimentKind" not in client.get_experiment(plain).tags

    port = free_port()
    root = f"http://127.0.0.1:{port}"
    server(mlflow_server_cmd(store, port, tmp_path / "mlruns" / "artifacts"), f"{root}/health", tmp_path, timeout=180)
    browser = chromium(tmp_path / "profile")
    wait = WebDriverWait(browser, WAIT_S)
    try:
        browser.get(f"{root}/{last['ui_path']}")
        parent = wait.until(lambda b: run_name(b, summary["parent_run"]))
        page = body(browser)
        assert "/runs" in browser.current_url and "/overview" not in browser.current_url, browser.current_url
        assert "Run Name" in page and OVERVIEW not in page, page[:2000]
        for close in browser.find_elements(
            By.CSS_SELECTOR, "button[data-component-id='mlflow.assistant.chat_panel.close']"
        ):
            close.click()  # the assistant's side panel: more of the table in the screenshot
        expand = parent.find_element(By.XPATH, "./ancestor::div[@role='gridcell']//button")
        expand.click()  # the parent's children are folded under it
        wait.until(lambda b: all(run_name(b, c) for c in CHILDREN))
        resize = browser.find_elements(
            By.CSS_SELECTOR, "div[role='columnheader'][col-id='attributes.`Run Name`'] .ag-header-cell-resize"
        )
        if resize:  # widen the name column so the screenshot shows the children's whole names
            ActionChains(browser).drag_and_drop_by_offset(resize[0], 160, 0).perform()
        shown = sorted(
            e.text
            for e in browser.find_elements(
                By.XPATH, "//div[@role='gridcell']//a[starts-with(span/text(), '" + SYSTEM + " / ')]"
            )
            if e.is_displayed()
        )
        assert shown == CHILDREN
        shot = tmp_path / "mlflow_runs_table.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
        if os.environ.get("VOICEBIAS_SCREENSHOT_DIR"):
            out = Path(os.environ["VOICEBIAS_SCREENSHOT_DIR"])
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, out / shot.name)

        # the bare address: the GenAI overview, with or without the kind tag (MLflow 3.17 does not read it)
        for exp_id, run in ((plain, "untagged-run"), (summary["experiment_id"], summary["parent_run"])):
            browser.get(f"{root}/#/experiments/{exp_id}")
            wait.until(lambda b: "/overview" in b.current_url and OVERVIEW in body(b))
            page = body(browser)
            assert "workflowType=genai" in browser.current_url and "Traces" in page, browser.current_url
            assert "Run Name" not in page and run_name(browser, run) is None, page[:2000]
    finally:
        browser.quit()
