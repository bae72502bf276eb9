"""The running compose stack (docker/stack-test.sh), as its users touch it: a retrain started from
the Prefect UI in a real browser, followed to Completed there, its model found in the MLflow UI,
and, after `docker compose down` and `up`, the same runs, versions and alias still there.

Each browser step leaves a screenshot in <STACK_OUT>/screenshots/."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from tests.integration.stack.conftest import Stack, bucket_keys
from tests.integration.stack.tiny_project import DATASET

MODEL = f"sidrec-{DATASET}"
# what the browser types into the run form: the tiny project's config file (STACK_CONFIG) and
# one override. The override is needed, not decoration: a model trained in seconds may trail the
# baselines, and the gate would then keep `champion` where it is (tests/integration/test_servers.py)
OVERRIDE = "register.gate_best_baseline=false"
UNTIL = "register"
RUN_TIMEOUT_S = 1200
BADGE = "//*[contains(@class, 'state-badge')]"  # a flow run's state, as the UI shows it


def api(stack: Stack, path: str, body: dict[str, Any] | None = None) -> Any:
    """A Prefect API call (POST with a JSON body, else GET)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{stack.prefect}/api/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def manual_runs(stack: Stack) -> list[dict[str, Any]]:
    """The flow runs of the retrain-manual deployment that carry the typed override."""
    (deployment,) = api(
        stack, "deployments/filter", {"deployments": {"name": {"any_": ["retrain-manual"]}}}
    )
    runs = api(stack, "flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})
    return [run for run in runs if run["parameters"].get("overrides") == [OVERRIDE]]


class Screens:
    """Numbered screenshots of one browser session."""

    def __init__(self, browser: Any, stack: Stack) -> None:
        self.browser, self.folder, self.count = browser, stack.out / "screenshots", 0
        self.folder.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        self.count += 1
        self.browser.save_screenshot(str(self.folder / f"{self.count:02d}-{name}.png"))


def wait_for(browser: Any, xpath: str, timeout: float = 60) -> Any:
    """The first element matching ``xpath`` that is displayed and enabled (the UI keeps hidden
    copies of some controls for other layouts)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(driver: Any) -> Any:
        found = driver.find_elements("xpath", xpath)
        return next((el for el in found if el.is_displayed() and el.is_enabled()), False)

    # The single-page UIs re-render while loading: an element found a moment ago may be gone
    # by the time it is asked whether it is displayed, and the next poll finds the new one.
    wait = WebDriverWait(browser, timeout, ignored_exceptions=(StaleElementReferenceException,))
    return wait.until(shown, f"nothing shown matches {xpath}")


def field(name: str, control: str = "") -> str:
    """XPath of the run form's block of the parameter ``name``, or of its ``control`` in it."""
    label = (
        f"//span[@class='schema-form-property__label' and normalize-space()='{name} (Optional)']"
    )
    block = (
        f"{label}/ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]"
    )
    return f"{block}//{control}" if control else block


def test_retrain_started_from_the_prefect_ui_promotes_a_champion(stack: Stack, browser) -> None:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    before = {run["id"] for run in manual_runs(stack)}
    screens = Screens(browser, stack)

    # Deployments -> retrain-manual -> Run -> Custom run
    browser.get(f"{stack.prefect}/deployments")
    wait_for(browser, "//a[normalize-space()='retrain-manual']").click()
    run_button = wait_for(browser, "//button[contains(normalize-space(), 'Run')]")
    screens.shot("prefect-deployment")
    run_button.click()
    wait_for(browser, "//button[normalize-space()='Custom run']").click()

    # the form: the config file, one override, the last stage
    config = wait_for(browser, field("config_path", "textarea"))
    config.send_keys(Keys.CONTROL, "a")
    config.send_keys(stack.config)
    wait_for(browser, field("overrides", "button[normalize-space()='Add item']")).click()
    wait_for(browser, field("overrides", "textarea")).send_keys(OVERRIDE)
    Select(wait_for(browser, field("until", "select"))).select_by_visible_text(UNTIL)
    screens.shot("prefect-custom-run-form")
    wait_for(browser, "//button[@type='submit' and normalize-space()='Submit']").click()

    # the UI goes back to the deployment's runs; the new run's page from there, followed until
    # its state badge says Completed (the UI polls)
    deadline = time.monotonic() + 60
    while not (new := [run for run in manual_runs(stack) if run["id"] not in before]):
        assert time.monotonic() < deadline, "the form's Submit created no flow run"
        time.sleep(1)
    (run,) = new
    wait_for(browser, f"//a[contains(@href, '/runs/flow-run/{run['id']}')]").click()
    WebDriverWait(browser, 60).until(lambda driver: run["id"] in driver.current_url)
    wait_for(browser, BADGE)
    screens.shot("prefect-flow-run-started")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        # read in the page, in one step: the badge is re-rendered as the state changes
        state = browser.execute_script(
            "const badge = document.querySelector('.state-badge');"
            "return badge ? badge.textContent : '';"
        )
        if state.strip() in {"Completed", "Failed", "Crashed", "Cancelled"}:
            break
        time.sleep(5)
    screens.shot("prefect-flow-run-final")
    (run,) = [r for r in manual_runs(stack) if r["id"] == run["id"]]
    assert state.strip() == "Completed", f"the run's page says {state!r}; the API: {run['state']}"
    # what the form sent is what the run received
    assert run["parameters"]["config_path"] == stack.config
    assert run["parameters"]["until"] == UNTIL
    assert run["state_type"] == "COMPLETED"

    # MLflow's UI: the registered model, its version and the champion alias
    browser.get(f"{stack.mlflow}/#/models/{MODEL}")
    wait_for(browser, "//*[contains(normalize-space(.), 'Version 1')]", timeout=60)
    wait_for(browser, "//*[contains(normalize-space(text()), 'champion')]", timeout=60)
    screens.shot("mlflow-model")
    browser.get(f"{stack.mlflow}/#/models/{MODEL}/versions/1")
    wait_for(browser, "//*[contains(normalize-space(text()), 'champion')]", timeout=60)
    screens.shot("mlflow-model-version")
    assert_champion(stack)

    # the champion's files went through the MLflow server into the S3 store's bucket
    keys = bucket_keys(stack, stack.bucket)
    assert any(key.endswith("MLmodel") for key in keys), keys


def assert_champion(stack: Stack) -> None:
    """One version of the tiny model, and `champion` on it (MLflow's REST API)."""
    url = f"{stack.mlflow}/api/2.0/mlflow/registered-models/get?name={MODEL}"
    with urllib.request.urlopen(url, timeout=30) as response:
        model = json.load(response)["registered_model"]
    assert [v["version"] for v in model.get("latest_versions", [])] == ["1"], model
    assert {"alias": "champion", "version": "1"} in model.get("aliases", []), model


def test_restarted_stack_keeps_runs_versions_alias_and_buckets(stack: Stack) -> None:
    """After `docker compose down` and `up` (volumes kept): Prefect's run and MLflow's version
    and alias (Postgres), the champion's files and the DVC remote's objects (the S3 store's
    volume; docker/stack-dvc-roundtrip.sh pushed them before the restart)."""
    (run,) = manual_runs(stack)
    assert run["state_type"] == "COMPLETED"
    assert_champion(stack)
    assert any(key.endswith("MLmodel") for key in bucket_keys(stack, stack.bucket))
    pushed = [key for key in bucket_keys(stack, stack.dvc_bucket) if "/files/md5/" in key]
    assert len(pushed) >= 10, pushed
