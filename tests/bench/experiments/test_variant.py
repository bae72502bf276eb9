"""bench.experiments.variant: a finished run folder copied and re-run from a stage with more settings (the
stages themselves faked: what is copied, which settings run and what is recorded)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import bench.common
import bench.experiments.variant
from bench.common import RUN_RECORD, StagesRun, ensure_run, folder_settings
from bench.experiments.variant import variant
from sidrec.errors import InputError


@pytest.fixture
def finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder whose faked stages ran until evaluate with ``project.seed=3``."""

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        (work / "metrics").mkdir(parents=True, exist_ok=True)
        (work / "metrics" / "sft.json").write_text('{"kept": 1}')
        return StagesRun(folder_settings(work, overrides), {}, {"sft": 5.0, "grpo": 3.0})

    monkeypatch.setattr(bench.common, "run_stages", fake_run)
    folder = tmp_path / "runs" / "seed-3"
    ensure_run(folder, ["project.seed=3"], "evaluate")
    return folder


def test_the_copy_reruns_from_start_with_the_sources_settings_then_the_new_ones(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[Path, list[str], str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append((work, list(overrides), start, until))
        assert (work / "metrics" / "sft.json").read_text() == '{"kept": 1}'  # copied first
        assert not (work / RUN_RECORD).exists()  # unfinished while it runs
        return StagesRun(folder_settings(work, overrides), {}, {"grpo": 7.0, "evaluate": 1.0})

    monkeypatch.setattr(bench.experiments.variant, "run_stages", fake_run)
    copy = tmp_path / "variants" / "seed-3"
    variant(finished, copy, "grpo", ["grpo.max_steps=5"])
    assert ran == [(copy, ["project.seed=3", "grpo.max_steps=5"], "grpo", "evaluate")]
    record = json.loads((copy / RUN_RECORD).read_text())
    assert record["overrides"] == ["project.seed=3", "grpo.max_steps=5"]
    assert record["seconds"] == {"sft": 5.0, "grpo": 7.0, "evaluate": 1.0}  # sft: the source's
    assert record["prepared_on"]["until"] == "sft"
    assert json.loads((finished / RUN_RECORD).read_text())["overrides"] == ["project.seed=3"]
    with pytest.raises(InputError, match="exists already"):  # never overwritten
        variant(finished, copy, "grpo", [])


def test_register_first_registers_with_the_sources_settings_alone(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[list[str], str, str]] = []

    def fake_run(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        ran.append((list(overrides), start, until))
        return StagesRun(folder_settings(work, overrides), {}, {"sft": 2.0})

    monkeypatch.setattr(bench.experiments.variant, "run_stages", fake_run)
    copy = tmp_path / "variants" / "seed-3"
    variant(finished, copy, "sft", ["sft.warm_start=champion"], register=True)
    assert ran == [
        (["project.seed=3"], "register", "register"),
        (["project.seed=3", "sft.warm_start=champion"], "sft", "evaluate"),
    ]
    ran.clear()
    variant(finished, tmp_path / "variants" / "seed-4", "grpo", [])  # off by default
    assert [stage for _, stage, _ in ran] == ["grpo"]


def test_a_failed_rerun_leaves_a_copy_without_a_record(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(work: Path, overrides: list[str], *, start: str, until: str) -> StagesRun:
        raise RuntimeError("killed")

    monkeypatch.setattr(bench.experiments.variant, "run_stages", failing)
    copy = tmp_path / "variants" / "seed-3"
    with pytest.raises(RuntimeError):
        variant(finished, copy, "grpo", [])
    assert copy.is_dir() and not (copy / RUN_RECORD).exists()


def test_a_source_without_a_finished_run_is_refused_before_copying(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    with pytest.raises(InputError, match="run folder not found"):
        variant(tmp_path / "nothing", copy, "grpo", [])
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(InputError, match="did not finish"):
        variant(tmp_path / "unfinished", copy, "grpo", [])
    assert not copy.exists()


def test_run_stages_leaves_grpo_out_when_it_is_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []

    def stage_module(name: str) -> types.SimpleNamespace:
        stage = name.removeprefix("tasks.")
        return types.SimpleNamespace(**{stage: lambda settings: called.append(stage)})

    monkeypatch.setattr(bench.common.importlib, "import_module", stage_module)
    run = bench.common.run_stages(tmp_path / "w", ["grpo.enabled=false"], start="sft")
    assert called == ["sft", "evaluate", "register"]
    assert list(run.seconds) == called
    called.clear()
    bench.common.run_stages(tmp_path / "w", [], start="sft", until="evaluate")
    assert called == ["sft", "grpo", "evaluate"]
