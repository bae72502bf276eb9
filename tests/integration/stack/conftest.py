"""The stack test's fixtures (docker/stack-test.sh starts the stack and runs these tests against
it). Outside `make stack-test` nothing here is collected: the tests need the running stack,
whose addresses the script passes in STACK_* variables, so `make test` never sees them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if "STACK_PREFECT_URL" not in os.environ:
    collect_ignore_glob = ["test_*.py"]


@dataclass(frozen=True)
class Stack:
    """The running stack, as docker/stack-test.sh started it."""

    prefect: str  # Prefect server (UI at /, API at /api)
    mlflow: str  # MLflow server (UI and API)
    s3: str  # the S3 API standing in for MinIO
    bucket: str  # MLflow's artifact bucket
    dvc_bucket: str  # the DVC remote's bucket
    config: str  # the tiny project's params.yaml, relative to the worker's project folder
    out: Path  # the test's output folder (screenshots go to out/screenshots)


@pytest.fixture(scope="session")
def stack() -> Stack:
    env = os.environ
    return Stack(
        prefect=env["STACK_PREFECT_URL"],
        mlflow=env["STACK_MLFLOW_URL"],
        s3=env["STACK_S3_URL"],
        bucket=env["STACK_BUCKET"],
        dvc_bucket=env["STACK_DVC_BUCKET"],
        config=env["STACK_CONFIG"],
        out=Path(env["STACK_OUT"]),
    )


def bucket_keys(stack: Stack, bucket: str) -> list[str]:
    """Every object key in ``bucket`` of the stack's S3 store."""
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=stack.s3, region_name="us-east-1",
        aws_access_key_id="any", aws_secret_access_key="any",
    )  # fmt: skip
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


@pytest.fixture
def browser(stack: Stack) -> Iterator[Any]:
    """Debian's chromium, headless, through its chromedriver (nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "apt-get install chromium chromium-driver (make stack-test does)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1440,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(arg)
    log = stack.out / "chromedriver.log"
    browser = webdriver.Chrome(options=options, service=Service(driver, log_output=str(log)))
    try:
        yield browser
    finally:
        browser.quit()
