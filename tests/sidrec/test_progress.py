from __future__ import annotations

import io
import os
import re
import sys
import types

import pytest

from sidrec import progress
from sidrec.errors import ConfigError
from sidrec.progress import ProgressBar, configure_library_bars, interactive


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(progress, "_clock", lambda: now[0])
    return now


def test_log_file_gets_a_line_per_interval_and_a_final_line(clock: list[float]) -> None:
    out = io.StringIO()
    for _ in ProgressBar(range(10), desc="epochs", file=out, interval=30, mininterval=0):
        clock[0] += 10  # every third step crosses the interval
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    counts = [re.search(r"(\d+)/10", line)[1] for line in text.splitlines()]  # type: ignore[index]
    assert counts == ["3", "6", "9", "10"]
    assert all(line.startswith("epochs: ") for line in text.splitlines())


def test_short_bar_leaves_only_its_final_line(clock: list[float]) -> None:
    out = io.StringIO()
    for _ in ProgressBar(range(5), file=out, interval=30, mininterval=0, leave=False):
        pass
    assert out.getvalue().count("\n") == 1 and "5/5" in out.getvalue()
    assert "\r" not in out.getvalue()


def test_disabled_bar_writes_nothing() -> None:
    out = io.StringIO()
    list(ProgressBar(range(5), file=out, interval=0, disable=True))
    assert out.getvalue() == ""


def test_terminal_gets_tqdm_bar() -> None:
    out = FakeTerminal()
    list(ProgressBar(range(5), file=out, mininterval=0))
    assert interactive(out) and not interactive(io.StringIO())
    assert "\r" in out.getvalue() and "5/5" in out.getvalue()


def test_interval_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDREC_PROGRESS_INTERVAL", "2.5")
    assert progress.line_interval() == 2.5
    monkeypatch.setenv("SIDREC_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="SIDREC_PROGRESS_INTERVAL"):
        progress.line_interval()


def test_library_bars_off_unless_user_wants_them(monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    for _, module, switch in progress._HF_SWITCHES:
        fake = types.SimpleNamespace(**{switch: lambda m=module: called.append(m)})
        monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(os, "environ", {"HF_DATASETS_DISABLE_PROGRESS_BARS": "0"})
    configure_library_bars()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert called == ["huggingface_hub.utils", "transformers.utils.logging"]
