"""dvc.yaml agrees with the code, `dvc repro` rebuilds then skips, and `dvc push` / `dvc pull`
move the outputs to a fresh clone that then has nothing to reproduce."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidrec.config import load_settings
from sidrec.stage import STAGE_PARAMS, STAGES, stage_inputs

REPO = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).parent / "dvc"


def _resolve(text: str, params: dict) -> str:
    def value(match: re.Match) -> str:
        node = params
        for part in match.group(1).split("."):
            node = node[part]
        return str(node)

    return re.sub(r"\$\{([\w.]+)\}", value, text)


def test_prefect_cache_keys_follow_the_params_each_stage_reads(project, make_settings):
    from sidrec.stage import stage_fingerprint

    base = make_settings(project)
    keys = {stage: stage_fingerprint(stage, base) for stage in STAGES}
    # a record folder or a preset changes nothing the data stages or SASRec read
    for sections in ({"project": {"runs_dir": "elsewhere"}}, {"project": {"preset": "quality"}}):
        other = make_settings(project, **sections)
        for stage in ("ingest", "validate", "split", "embed", "sids", "baselines"):
            assert stage_fingerprint(stage, other) == keys[stage], (sections, stage)
    # sft sizes the SID vocabulary by the codebook; where outputs go is part of every key
    wider = make_settings(project, sids={"codebook_size": 512})
    assert stage_fingerprint("sft", wider) != keys["sft"]
    moved = make_settings(project, project={"metrics_dir": "m2"})
    assert all(stage_fingerprint(stage, moved) != keys[stage] for stage in STAGES)


def test_dvc_stages_match_code_params_and_paths():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    paths = load_settings(REPO / "params.yaml").paths
    assert list(dvc) == list(STAGES)
    for stage in STAGES:
        assert tuple(dvc[stage]["params"]) == STAGE_PARAMS[stage]
        assert dvc[stage]["cmd"] == f"sidrec {stage}"
    outs = {
        stage: [
            _resolve(next(iter(o)) if isinstance(o, dict) else o, params)
            for o in dvc[stage].get("outs", [])
        ]
        for stage in STAGES
    }
    assert outs == {
        "ingest": [str(paths.raw_dir)],
        "validate": [str(paths.validated_dir), str(paths.drift_dir)],
        "split": [str(paths.split(n)) for n in ("train", "valid", "test")],
        "embed": [str(paths.item_emb), str(paths.item_emb_manifest)],
        "sids": [str(paths.sids_dir)],
        "baselines": [str(paths.sasrec_model), str(paths.ease_choice)],
        "sft": [str(paths.sft_model)],
        "grpo": [str(paths.grpo_model)],
        "evaluate": [str(paths.eval_users)],
        "register": [],
    }
    assert paths.sid_map.parent == paths.sids_dir and paths.quantizer.parent == paths.sids_dir
    assert {paths.load_profiles.parent, paths.load_summaries.parent} == {paths.drift_dir}
    assert _resolve(next(iter(dvc["validate"]["metrics"][1])), params) == str(
        paths.metrics("drift")
    )
    metrics = {stage: _resolve(next(iter(dvc[stage]["metrics"][0])), params) for stage in STAGES}
    names = (
        "ingest",
        "validation",
        "split",
        "embed",
        "sids",
        "baselines",
        "sft",
        "grpo",
        "eval",
        "register",
    )
    assert metrics == {s: str(paths.metrics(m)) for s, m in zip(STAGES, names, strict=True)}


@pytest.mark.parametrize("embedding", ["text", "collaborative", "hybrid"])
def test_dvc_deps_hold_every_file_a_stage_reads(embedding):
    """What the code fingerprints (``stage_inputs``) is a DVC dep, or inside one; collaborative
    and hybrid SIDs read the train split, text SIDs do not."""
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    settings = load_settings(REPO / "params.yaml", [f"sids.embedding={embedding}"])
    for stage in STAGES[1:]:  # ingest reads the configured source files
        deps = [Path(_resolve(d, params)) for d in dvc[stage]["deps"]]
        for path in stage_inputs(stage, settings):
            assert any(path == d or d in path.parents for d in deps), (stage, path)
    train = settings.paths.split("train")
    assert (train in stage_inputs("sids", settings)) == (embedding != "text")


def _run(cmd: list[str], cwd: Path, *, stderr: bool = True) -> str:
    """stdout (and stderr, unless ``stderr`` is false) of a command that must succeed."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + (proc.stderr if stderr else "")


@pytest.mark.slow
def test_dvc_repro_builds_then_has_nothing_to_do(tmp_path, csv_project, run_sidrec):
    work, params = csv_project(tmp_path / "proj")
    _run(["git", "init", "-q"], work)
    _run([str(DVC), "init", "-q"], work)
    _run([str(DVC), "config", "core.analytics", "false"], work)
    first = _run([str(DVC), "repro"], work)
    assert _ran(first) == set(STAGES)
    assert (work / "data" / "sids" / "tiny" / "sid_map.json").exists()
    second = _run([str(DVC), "repro"], work)
    assert "Data and pipelines are up to date." in second
    assert _ran(second) == set()

    # shared storage: what the repro recorded goes to a remote, and another machine's clone
    # pulls it and reproduces nothing
    _push_then_pull_into_a_clone(work, tmp_path)

    # a GRPO key that does not change what it learns: grpo re-runs and, training on CPU being
    # seeded, writes the same model folder with the same kept step; its timings live in
    # metrics/grpo.json, which nothing reads, so evaluate and register stay skipped
    params["grpo"]["log_samples_every"] += 1
    _write_params(work, params)
    assert _ran(_run([str(DVC), "repro"], work)) == {"grpo"}

    # a param read by one stage only: that stage, and no other, is out of date (`dvc status`
    # compares each stage's recorded inputs, as `dvc repro` does before running it)
    for section, key, value, stage in [
        ("sasrec", "patience", 1, "baselines"),
        ("grpo", "learning_rate", 0.0005, "grpo"),
    ]:
        before = params[section][key]
        params[section][key] = value
        _write_params(work, params)
        assert set(json.loads(_run([str(DVC), "status", "--json"], work, stderr=False))) == {stage}
        params[section][key] = before
    _write_params(work, params)

    # new split files: every stage that reads them is out of date, and none upstream (DVC
    # re-runs a stage whose recorded inputs changed; `dvc repro` would start from these)
    params["split"]["max_history"] = 1  # shorter histories: new split files
    _write_params(work, params)
    assert _ran(_run([str(DVC), "repro", "split"], work)) == {"split"}
    stale = set(json.loads(_run([str(DVC), "status", "--json"], work, stderr=False)))
    # sids depends on the train split (collaborative / hybrid SIDs read it)
    assert {"sids", "baselines", "sft", "grpo", "evaluate"} <= stale
    assert stale.isdisjoint({"ingest", "validate", "embed", "split"})

    # new item text → new embeddings → new SIDs (`dvc repro sids`: the stages up to sids)
    params["embed"]["template"] = "{title}"
    _write_params(work, params)
    assert _ran(_run([str(DVC), "repro", "sids"], work)) == {"embed", "sids"}

    # Prefect runs share the state (sidrec/dvc_state.py): a run with an override leaves
    # dvc.lock as it was; a run from params.yaml as it is records the stages it ran, which DVC
    # then finds up to date (the later ones stay out of date: their inputs changed)
    lock = (work / "dvc.lock").read_bytes()
    out = run_sidrec(work, ["pipeline", "--until", "split", "--set", "split.max_history=2"])
    assert "dvc.lock left untouched" in out and "(split.max_history=2)" in out
    assert (work / "dvc.lock").read_bytes() == lock
    assert "split" in json.loads(_run([str(DVC), "status", "--json"], work, stderr=False))
    out = run_sidrec(work, ["pipeline", "--until", "sids"])
    first = STAGES[: STAGES.index("sids") + 1]
    assert f"dvc: recorded {', '.join(first)} in dvc.lock" in out
    stale = set(json.loads(_run([str(DVC), "status", "--json"], work, stderr=False)))
    assert stale == set(STAGES[len(first) :])
    assert _ran(_run([str(DVC), "repro", "sids"], work)) == set()


def _push_then_pull_into_a_clone(work: Path, tmp_path: Path) -> None:
    """`dvc push` from ``work`` to a local-folder remote; a git clone of ``work`` (code,
    params.yaml, dvc.yaml, dvc.lock, metrics and .dvc/config with the remote: no data, no DVC
    cache) then runs `dvc pull` and gets every output byte for byte, `dvc status` is clean and
    `dvc repro` runs no stage."""
    _run([str(DVC), "remote", "add", "--default", "storage", str(tmp_path / "remote")], work)
    _run([str(DVC), "push"], work)
    assert json.loads(_run([str(DVC), "status", "--cloud", "--json"], work, stderr=False)) == {}

    # git holds what a checkout holds (the repo's .gitignore; the tests' Prefect home)
    (work / ".gitignore").write_text((REPO / ".gitignore").read_text() + ".prefect/\n")
    _run(["git", "add", "--all"], work)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "run"], work)
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(work), str(clone)], tmp_path)
    assert not (clone / "data").exists() and not (clone / "artifacts").exists()
    assert not (clone / ".dvc" / "cache").exists()

    lock = yaml.safe_load((work / "dvc.lock").read_text())["stages"]
    outs = [out["path"] for stage in lock.values() for out in stage.get("outs", [])]
    pushed = _digests(work, outs)
    assert "data/sids/tiny/sid_map.json" in pushed
    _run([str(DVC), "pull"], clone)
    assert _digests(clone, outs) == pushed
    assert json.loads(_run([str(DVC), "status", "--json"], clone, stderr=False)) == {}
    repro = _run([str(DVC), "repro"], clone)
    assert "Data and pipelines are up to date." in repro and _ran(repro) == set()


def _digests(root: Path, paths: list[str]) -> dict[str, str]:
    """SHA-256 of every file in ``paths`` (files or folders) under ``root``, by relative path."""
    files: list[Path] = []
    for path in paths:
        top = root / path
        files += sorted(top.rglob("*")) if top.is_dir() else [top]
    return {
        f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in files
        if f.is_file()
    }


def _write_params(work: Path, params: dict) -> None:
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '(\w+)'", output))


@pytest.mark.parametrize(
    ("overrides", "reads"),
    [
        (["grpo.rewards.collaborative=0.5"], True),  # the collaborative reward
        (["grpo.rewards.collaborative=0", "grpo.sft_anchor=1", "sft.distill=1"], True),  # teacher
        (["grpo.rewards.collaborative=0", "grpo.sft_anchor=1", "sft.distill=0"], False),
        (["grpo.rewards.collaborative=0", "grpo.sft_anchor=0", "sft.distill=1"], False),
    ],
)
def test_grpo_fingerprints_sasrec_where_it_reads_it(tmp_path, overrides, reads):
    settings = load_settings(
        REPO / "params.yaml", [f"project.artifacts_dir={tmp_path}", *overrides]
    )
    model = settings.paths.sasrec_model
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    assert (model / "model.safetensors" in stage_inputs("grpo", settings)) == reads


COMPUTATION = ("models", "tasks", "sidrec/sources", "sidrec/protocol.py")
"""The code that decides what a stage writes; the rest of `sidrec/` (settings, file I/O,
tracking, orchestration) runs it without changing its results."""


def _project_imports(module: Path) -> set[Path]:
    """The repository files ``module`` imports (``from x.y import z`` or ``import x.y``), as
    paths: ``x/y.py`` or ``x/y/__init__.py``, and ``x/y/z.py`` where z is a module."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            base = REPO / Path(*name.split("."))
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    found.add(candidate)
    return found


def test_dvc_deps_hold_the_code_each_stage_runs():
    """A change to any module a stage's computation imports (transitively) re-runs the stage
    under `dvc repro`, as it does under Prefect's cache, which keys on all project code."""
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    computation = [REPO / c for c in COMPUTATION]

    def computes(module: Path) -> bool:
        return any(module == c or c in module.parents for c in computation)

    missing = {}
    for stage in STAGES:
        deps = [REPO / d for d in dvc[stage]["deps"] if "${" not in d]
        todo, seen = [REPO / "tasks" / f"{stage}.py"], set()
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(m for m in _project_imports(module) if computes(m))
        for module in sorted(seen):
            if not any(module == d or d in module.parents for d in deps):
                missing.setdefault(stage, []).append(str(module.relative_to(REPO)))
    assert missing == {}
