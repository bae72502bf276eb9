"""The project's progress bar: a tqdm bar on a terminal, plain log lines elsewhere.

tqdm redraws its bar with carriage returns, which a terminal turns into one moving line and
a log file (``make run > run.log``, a Prefect worker, CI) keeps as one long line of frames.
Off a terminal :class:`ProgressBar` writes the bar's text as a line of its own instead, at most
every ``SIDREC_PROGRESS_INTERVAL`` seconds (default 30) and once more when it closes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

from sidrec.errors import ConfigError

INTERVAL_VARIABLE = "SIDREC_PROGRESS_INTERVAL"
_clock = time.monotonic  # module-level so tests can swap in a fake clock

# Hugging Face libraries read these variables when imported; the function switches off a
# library imported before them (transformers follows the hub's variable).
_HF_SWITCHES = (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub.utils", "disable_progress_bars"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "transformers.utils.logging", "disable_progress_bar"),
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "datasets.utils", "disable_progress_bars"),
)


def interactive(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr, where bars go) is a terminal."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def line_interval() -> float:
    """Seconds between two progress lines off a terminal (``SIDREC_PROGRESS_INTERVAL``)."""
    raw = os.environ.get(INTERVAL_VARIABLE, "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"{INTERVAL_VARIABLE} must be a number of seconds >= 0, got {raw!r}")
    return seconds


class ProgressBar(tqdm):
    """tqdm with the same arguments; off a terminal it prints lines instead of redrawing.

    There it prints the first line after ``interval`` seconds (default
    :func:`line_interval`) and one every ``interval`` seconds after, so a short bar leaves
    only its final line.
    """

    def __init__(self, *args: Any, interval: float | None = None, **kwargs: Any) -> None:
        # set before tqdm's __init__, which draws the bar once
        self._lines = not interactive(kwargs.get("file"))
        self._interval = line_interval() if interval is None else interval
        self._line_t = _clock()
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._lines:
            return bool(super().display(msg, pos))
        if msg == "":  # tqdm asks to wipe the bar: a log keeps its lines
            return False
        now = _clock()
        if now - self._line_t < self._interval:
            return True
        self._line_t = now
        self.fp.write(f"{(msg or str(self)).strip()}\n")
        self.fp.flush()
        return True

    def clear(self, nolock: bool = False) -> None:
        if not self._lines:
            super().clear(nolock)

    def close(self) -> None:
        if self._lines and not getattr(self, "disable", True):
            self._line_t = -float("inf")
            self.display()  # the final line, also for leave=False bars
            self.leave = False  # so tqdm's close only "wipes" the bar, a no-op here
        super().close()


def configure_library_bars() -> None:
    """Off a terminal, switch off the bars of MLflow and the Hugging Face libraries (downloads,
    weight loading, dataset maps). A variable the user has set takes precedence."""
    if interactive():
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # read at each use
    for variable, module, switch in _HF_SWITCHES:
        if os.environ.setdefault(variable, "1") == "1" and module in sys.modules:
            getattr(sys.modules[module], switch)()
