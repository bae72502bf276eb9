"""Shared fixtures: one way to make a project, its settings, its files and its model.

- ``project`` (``make_project`` at other scopes): a throw-away project folder holding a copy
  of the repo's params.yaml.
- ``make_settings`` / ``csv_settings``: that project's settings with some keys replaced.
- ``write_csv_dataset``, ``write_validated_catalog``, ``write_embeddings``: one stage's files,
  written directly.
- ``tiny_project`` and ``tiny_model``: the tiny recommender (12 items, their SIDs, 8 users) and
  its random tiny model, written in seconds, for the tests of what is registered and served.
- ``synthetic_project`` and ``prepared``: a catalog where item i is followed by item i + 1,
  run from raw CSV to SIDs and SASRec, for the tests that train; ``trained`` adds its SFT model
  (tests/tasks/conftest.py: ``sft_result``). Both are built once per session; each test gets
  its own copy.
- ``env_example``: the variables of .env.example.

Fixtures of one folder's tests live in that folder's conftest.py: ``sid_maps`` and
``split_rows`` (tests/models), ``amazon`` (tests/sidrec/sources), ``s3_store``
(tests/integration), ``sft_result`` (tests/tasks).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import yaml

from sidrec.config import Settings, load_settings

if TYPE_CHECKING:
    import pandas as pd

    from sidrec.stage import StageResult

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect's home (ephemeral database, persisted task results) in a throw-away folder
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="sidrec-prefect-")
# MLflow tracking in a throw-away SQLite database (artifacts land in each test's cwd)
os.environ["MLFLOW_TRACKING_URI"] = (
    f"sqlite:///{tempfile.mkdtemp(prefix='sidrec-mlflow-')}/mlflow.db"
)
# pytest-xdist (`make test`): each worker and its subprocesses get their share of the cores
# (torch reads it when first imported), not one thread per core each
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

Sections = Mapping[str, Mapping[str, Any]]
"""``{section: {key: value}}``: keys of params.yaml to replace."""


@pytest.fixture(autouse=True)
def _mlflow_uri_from_the_environment() -> Iterator[None]:
    """After each test MLflow forgets the tracking URI the code under test set
    (`mlflow.set_tracking_uri`, which also rewrites ``MLFLOW_TRACKING_URI``): it would outlive the
    test and, being process-wide, win over a later test's environment in the same worker."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if (mlflow := sys.modules.get("mlflow")) is not None:
        mlflow.set_tracking_uri(None)  # unsets the variable too
    if before is not None:
        os.environ["MLFLOW_TRACKING_URI"] = before


# ---------------------------------------------------------------- the project and its settings


def _new_project(folder: Path) -> Path:
    shutil.copy(REPO / "params.yaml", folder / "params.yaml")
    return folder


def _overrides(*layers: Sections) -> list[str]:
    """``section.key=value`` overrides (values as YAML); a later layer wins key by key."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            merged[section] = {**merged.get(section, {}), **values}
    return [
        f"{section}.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
        for section, values in merged.items()
        for key, value in values.items()
    ]


TEST_BASE: Sections = {"sids": {"embedding": "text"}}
"""Under every test project's settings: SIDs quantize the given item embeddings (a few test
users cannot carry collaborative factors); tests of collaborative and hybrid SIDs set it."""


def _settings(root: Path, *layers: Sections) -> Settings:
    return load_settings(root / "params.yaml", _overrides(TEST_BASE, *layers))


@pytest.fixture(scope="session")
def make_project() -> Callable[[Path], Path]:
    """``make_project(folder)``: the folder, holding a copy of the repo's params.yaml (for
    projects shared by a module; a test's own is ``project``)."""
    return _new_project


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder (cwd) holding a copy of the repo's params.yaml."""
    monkeypatch.chdir(tmp_path)
    return _new_project(tmp_path)


@pytest.fixture(scope="session")
def make_settings() -> Callable[..., Settings]:
    """``make_settings(root, **sections)``: settings from ``root/params.yaml`` with the
    sections' keys replaced."""

    def make(root: Path, /, **sections: dict[str, Any]) -> Settings:
        return _settings(root, sections)

    return make


@pytest.fixture(scope="session")
def csv_settings() -> Callable[..., Settings]:
    """``csv_settings(root, inter, items, dataset="tiny", **sections)``: settings that ingest the
    CSV files ``inter`` and ``items`` (users need 3 interactions)."""

    def make(
        root: Path, inter: Path, items: Path, dataset: str = "tiny", **sections: dict[str, Any]
    ) -> Settings:
        source: Sections = {
            "project": {"dataset": dataset},
            "ingest": {"source": "csv", "interactions": str(inter), "items": str(items)},
            "validate": {"min_user_interactions": 3},
        }
        return _settings(root, source, sections)

    return make


# ---------------------------------------------------------------- one stage's files


def _write_csv_dataset(
    folder: Path, interactions: str | None = None, items: str | None = None
) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if interactions is None:
        rows = ["user_id,item_id,timestamp,rating"]
        for u in range(1, 4):
            for k, item in enumerate(["a", "b", "c", "d"]):
                rows.append(f"u{u},{item},{1_600_000_000 + 100 * u + k},{(u + k) % 5 + 1}")
        interactions = "\n".join(rows) + "\n"
    if items is None:
        items = "item_id,title,description\na,Alpha,First\nb,Beta,Second\nc,Gamma,Third\nd,Delta,Fourth\n"
    inter_path, items_path = folder / "interactions.csv", folder / "items.csv"
    inter_path.write_text(interactions)
    items_path.write_text(items)
    return inter_path, items_path


@pytest.fixture(scope="session")
def write_csv_dataset() -> Callable[..., tuple[Path, Path]]:
    """``write_csv_dataset(folder, interactions=None, items=None)``: ``interactions.csv`` and
    ``items.csv`` in ``folder`` from the given text, by default a small valid dataset (3 users x
    4 interactions, 4 items); returns their paths."""
    return _write_csv_dataset


def sidrec_env(work: Path) -> dict[str, str]:
    """The environment of a `python -m sidrec` subprocess in the project folder ``work``: the
    ephemeral Prefect API with its home in the folder and the folder's own MLflow store, as on
    a fresh machine."""
    drop = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PREFECT_HOME"] = str(work / ".prefect")
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as sock:  # the kernel picks a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """``free_port()``: a loopback port that nothing listens on (for a server a test starts,
    or one that must not answer)."""
    return _free_port


def _env_example() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (REPO / ".env.example").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="session")
def env_example() -> dict[str, str]:
    """The variables of .env.example (what `docker compose` reads from .env), by name."""
    return _env_example()


@pytest.fixture(scope="session")
def sidrec_subprocess_env() -> Callable[[Path], dict[str, str]]:
    """``sidrec_subprocess_env(work)``: see :func:`sidrec_env`."""
    return sidrec_env


def _run_sidrec(work: Path, args: list[str]) -> str:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "sidrec", *args],
        cwd=work,
        env=sidrec_env(work),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return " ".join((proc.stdout + proc.stderr).split())  # the console wraps long log lines


@pytest.fixture(scope="session")
def run_sidrec() -> Callable[[Path, list[str]], str]:
    """``run_sidrec(work, args)``: `python -m sidrec <args>` in the project folder ``work``
    (its copy of the code, :func:`sidrec_env`), which must succeed; its stdout + stderr with
    whitespace runs (console line wraps) as single spaces."""
    return _run_sidrec


@pytest.fixture(scope="session")
def csv_project(write_csv_dataset) -> Callable[[Path], tuple[Path, dict[str, Any]]]:
    """``csv_project(folder)``: a project folder like a checkout — the repo's code, dvc.yaml and
    params.yaml — set to a 24-item CSV dataset of 12 users and budgets that train every stage
    in seconds; returns the folder and its params (write them back with ``yaml.safe_dump``)."""

    def make(work: Path) -> tuple[Path, dict[str, Any]]:
        work.mkdir(parents=True)
        for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
            shutil.copy(REPO / name, work / name)
        for package in ("sidrec", "tasks", "models", "flows"):
            shutil.copytree(
                REPO / package, work / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        rows = [
            f"u{u},i{(3 * u + k) % 24},{1_600_000_000 + 100 * u + k}"
            for u in range(12)
            for k in range(8)
        ]
        titles = [f"i{n},Item number {n} about topic {n % 4}" for n in range(24)]
        write_csv_dataset(
            work / "src",
            "user_id,item_id,timestamp\n" + "\n".join(rows) + "\n",
            "item_id,title\n" + "\n".join(titles) + "\n",
        )
        params = yaml.safe_load((work / "params.yaml").read_text())
        params["project"]["dataset"] = "tiny"
        params["ingest"].update(
            source="csv", interactions="src/interactions.csv", items="src/items.csv"
        )
        params["validate"]["min_user_interactions"] = 3
        # 24 items; hybrid SIDs (the default) with fewer factors than the 12 users
        params["sids"].update(method="rqkmeans", levels=2, codebook_size=8, collaborative_dim=8)
        params["model"]["tiny"].update(vocab_size=400, hidden_size=32, intermediate_size=64)
        params["sft"].update(epochs=1, batch_size=8)
        params["grpo"].update(
            num_generations=4, prompts_per_step=4, max_steps=2, eval_every=2, eval_users=8
        )
        params["sasrec"].update(max_epochs=2)
        params["evaluate"].update(ks=[1, 5, 10], num_beams=10, bootstrap_resamples=200)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        return work, params

    return make


def _write_validated_catalog(settings: Settings, n_items: int) -> list[str]:
    import pandas as pd

    from sidrec.io import AtomicOutputs
    from sidrec.schemas import ITEMS

    topics = ["space", "love", "war", "crime", "music", "sport", "food", "travel"]
    items = pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(n_items)],
            "title": [f"A film about {topics[k % len(topics)]} number {k}" for k in range(n_items)],
            "genres": [topics[k % len(topics)] for k in range(n_items)],
        }
    )
    with AtomicOutputs() as out:
        out.parquet(items, settings.paths.validated("items"), ITEMS)
    return items["item_id"].tolist()


@pytest.fixture(scope="session")
def write_validated_catalog() -> Callable[[Settings, int], list[str]]:
    """``write_validated_catalog(settings, n_items)``: ``data/validated/<ds>/items.parquet`` with
    ``n_items`` titled items (for the embed and sids stages); returns their ids."""
    return _write_validated_catalog


def _write_embeddings(settings: Settings, emb: Any, item_ids: list[str]) -> None:
    import numpy as np

    from sidrec.io import atomic_write_json
    from sidrec.protocol import catalog_fingerprint

    settings.paths.item_emb.parent.mkdir(parents=True, exist_ok=True)
    np.save(settings.paths.item_emb, np.asarray(emb, dtype=np.float32))
    atomic_write_json(
        settings.paths.item_emb_manifest,
        {
            "encoder": settings.embed.encoder,
            "dim": int(np.shape(emb)[1]),
            "template": settings.embed.template,
            "items": len(item_ids),
            "item_ids_sha256": catalog_fingerprint(item_ids),
        },
    )


@pytest.fixture(scope="session")
def write_embeddings() -> Callable[[Settings, Any, list[str]], None]:
    """``write_embeddings(settings, emb, item_ids)``: ``item_emb.npy`` and its manifest as the
    embed stage writes them, from a given matrix."""
    return _write_embeddings


# ---------------------------------------------------------------- the tiny recommender

_LEVELS, _CODES = 2, 4
_ITEM_IDS = [f"i{n}" for n in range(12)]
_TITLES = {
    i: f"Film number {n} about {['space', 'love', 'war'][n % 3]}" for n, i in enumerate(_ITEM_IDS)
}


def _save_tiny_model(target: Path, seed: int = 0) -> Path:
    from models.lm import add_sid_tokens, build_tiny, train_tokenizer
    from models.prompts import seq_rec_prompt

    texts = [*_TITLES.values(), seq_rec_prompt([]), "The user interacted with . Next item:"] * 3
    tokenizer = train_tokenizer(texts, 300)
    add_sid_tokens(tokenizer, _LEVELS, _CODES)
    model = build_tiny(
        tokenizer,
        hidden_size=16,
        layers=1,
        heads=2,
        kv_heads=1,
        intermediate_size=32,
        max_length=64,
        seed=seed,
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Path]:
    """``tiny_model(target, seed=0)``: the tiny model folder at ``target``, as sft saves it: a
    random tiny Qwen2 and a tokenizer trained on the tiny project's titles, with its SID tokens
    (two levels of four codes). Returns ``target``."""
    return _save_tiny_model


class TinyProject:
    """The tiny recommender: 12 titled items with two-level SIDs, 8 users' histories, settings
    that run every stage on them in seconds, and random tiny models (tests assert structure,
    not quality)."""

    item_ids: ClassVar[list[str]] = _ITEM_IDS
    titles: ClassVar[dict[str, str]] = _TITLES
    sid_map: ClassVar[dict[str, list[int]]] = {
        i: [n // _CODES, n % _CODES] for n, i in enumerate(_ITEM_IDS)
    }
    users: ClassVar[dict[str, list[str]]] = {
        "u1": ["i0", "i1", "i2", "i3"],
        "u2": ["i5", "i4"],
        "u3": ["i7", "i8", "i9", "i10", "i11"],
        "u4": ["i2", "i3", "i4", "i5"],
        "u5": ["i6", "i7", "i8"],
        "u6": ["i0", "i2", "i4", "i6"],
        "u7": ["i1", "i3", "i5", "i7", "i9"],
        "u8": ["i11", "i10", "i9", "i8"],
    }
    """Interactions in time order; u1, u4, u5, u7 and u8 are in the validation gate half."""
    preset: ClassVar[Sections] = {
        "project": {"dataset": "tiny"},
        "model": {"max_length": 64},
        "split": {"max_history": 3},
        "grpo": {"enabled": False},
        "evaluate": {"ks": [1, 5, 10], "num_beams": 10, "bootstrap_resamples": 200},
        "sasrec": {"max_epochs": 2},
        "register": {"top_k": 5},
    }
    """The keys every settings of the tiny project replaces."""

    def catalog(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            {"item_id": self.item_ids, "title": [self.titles[i] for i in self.item_ids]}
        )

    def overrides(self, **sections: dict[str, Any]) -> list[str]:
        """``--set`` overrides of the tiny project (``sections`` replace or add keys)."""
        return _overrides(TEST_BASE, self.preset, sections)

    def settings(self, root: Path, **sections: dict[str, Any]) -> Settings:
        return _settings(root, self.preset, sections)

    def write(self, settings: Settings, *, grpo_model: bool = False) -> None:
        """Validated catalog and interactions, SID map and the SFT (and optionally GRPO) model."""
        import pandas as pd

        from sidrec.io import AtomicOutputs, atomic_write_json
        from sidrec.schemas import INTERACTIONS, ITEMS

        paths = settings.paths
        rows = [
            (user, item, 1_600_000_000 + 10 * k)
            for user, items in self.users.items()
            for k, item in enumerate(items)
        ]
        inter = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])
        with AtomicOutputs() as out:
            out.parquet(self.catalog(), paths.validated("items"), ITEMS)
            out.parquet(inter, paths.validated("interactions"), INTERACTIONS)
        atomic_write_json(paths.sid_map, self.sid_map)
        _save_tiny_model(paths.sft_model, seed=0)
        if grpo_model:  # with the record the grpo stage writes into it: a kept step past 0
            _save_tiny_model(paths.grpo_model, seed=1)
            atomic_write_json(paths.grpo_kept_step, {"best_step": 10})

    def evaluate(self, settings: Settings) -> dict[str, Any]:
        """split → baselines → evaluate: a real ``metrics/eval.json`` with per-user scores and
        fingerprints of today's files. Returns the report."""
        from tasks.baselines import baselines
        from tasks.evaluate import evaluate
        from tasks.split import split

        split(settings)
        baselines(settings)
        return evaluate(settings).metrics


@pytest.fixture(scope="session")
def tiny_project() -> TinyProject:
    """The tiny recommender: its data (``item_ids``, ``titles``, ``sid_map``, ``users``,
    ``catalog()``), ``settings(root, **sections)`` / ``overrides(**sections)`` and
    ``write(settings)`` / ``evaluate(settings)``, which write its files."""
    return TinyProject()


# ---------------------------------------------------------------- the synthetic catalog


@dataclass(frozen=True)
class SyntheticProject:
    """A catalog where item i is followed by item i + 1: user u interacts with items u, u + 1,
    … u + 7 (mod ``n_items``), so with as many users as items every item starts one user and
    popularity is flat, while i → i + 1 is learnable. Items get random unit embeddings."""

    n_items: int = 60
    n_users: int = 60
    emb_dim: int = 16
    preset: ClassVar[Sections] = {
        "project": {"dataset": "syn"},
        "ingest": {
            "source": "csv",
            "interactions": "src/interactions.csv",
            "items": "src/items.csv",
        },
        "sids": {"method": "rqkmeans", "levels": 2, "codebook_size": 16},
        "model": {
            "max_length": 128,
            "tiny": {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64},
        },
        "sft": {
            "epochs": 30,
            "batch_size": 4,  # 45 steps an epoch: 60 windows (a user's 6 train items) + 120 pairs
            # unpacked: windows and alignment pairs here are all 15-19 tokens, so packing (which sorts
            # by length) would fill rows with one kind and, at a few rows a step, give the pairs
            # steps of their own (HR@10 1.0 unpacked, 0.35-0.52 packed); tests/models/
            # test_sft_trainer.py covers packing, the MovieLens end-to-end test runs it
            "packing": False,
            "learning_rate": 0.005,
            "window": 8,  # 8 x (2 SID tokens + EOS) + BOS fits max_length 128
            "window_stride": None,  # a user's 6 train items: one window each
            "eval_every": 10,
            "eval_rows": 20,
            "logging_steps": 5,
        },
        "sasrec": {"max_epochs": 3},
        "evaluate": {"ks": [1, 5, 10], "num_beams": 10, "batch_size": 8},
        # these settings evaluate the SFT model; tests/tasks/test_grpo.py turns GRPO on
        "grpo": {"enabled": False},
    }
    """The keys every settings of the synthetic project replaces (SFT learns the pattern)."""

    def overrides(self, **sections: dict[str, Any]) -> list[str]:
        """``--set`` overrides of the synthetic project (``sections`` replace or add keys)."""
        return _overrides(TEST_BASE, self.preset, sections)

    def settings(self, root: Path, **sections: dict[str, Any]) -> Settings:
        return _settings(root, self.preset, sections)

    def write(self, settings: Settings) -> None:
        """Raw CSV files at the settings' ingest paths → ingest → validate → split, random unit
        embeddings → sids."""
        import numpy as np

        from tasks.ingest import ingest
        from tasks.sids import sids
        from tasks.split import split
        from tasks.validate import validate

        rows = [
            f"u{u},i{(u + k) % self.n_items},{1_600_000_000 + 1000 * u + k}"
            for u in range(self.n_users)
            for k in range(8)
        ]
        titles = [f"i{n},Item {n} in group {n % 5}" for n in range(self.n_items)]
        assert settings.ingest.interactions and settings.ingest.items, "a csv source is needed"
        for path, text in [
            (settings.ingest.interactions, "user_id,item_id,timestamp\n" + "\n".join(rows)),
            (settings.ingest.items, "item_id,title\n" + "\n".join(titles)),
        ]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        for stage in (ingest, validate, split):
            stage(settings)
        emb = np.random.default_rng(0).normal(size=(self.n_items, self.emb_dim)).astype(np.float32)
        _write_embeddings(
            settings,
            emb / np.linalg.norm(emb, axis=1, keepdims=True),
            [f"i{n}" for n in range(self.n_items)],
        )
        sids(settings)


@pytest.fixture(scope="session")
def synthetic_project() -> SyntheticProject:
    """The synthetic catalog (60 items, 60 users): ``settings(root, **sections)`` and
    ``write(settings)``; ``dataclasses.replace`` resizes it."""
    return SyntheticProject()


@pytest.fixture(scope="session")
def _prepared_template(
    tmp_path_factory: pytest.TempPathFactory, synthetic_project: SyntheticProject
) -> Path:
    """The synthetic project built once per session (``prepared`` copies it per test)."""
    from tasks.baselines import baselines

    root = _new_project(tmp_path_factory.mktemp("prepared"))
    with contextlib.chdir(root):  # settings' paths are relative to the project folder
        settings = synthetic_project.settings(root)
        synthetic_project.write(settings)
        baselines(settings)
    return root


@pytest.fixture(scope="session")
def _trained_template(
    tmp_path_factory: pytest.TempPathFactory,
    _prepared_template: Path,
    synthetic_project: SyntheticProject,
) -> tuple[Path, StageResult]:
    """The prepared project with its SFT model, trained once per session; and sft's result."""
    from tasks.sft import sft

    root = tmp_path_factory.mktemp("trained")
    shutil.copytree(_prepared_template, root, dirs_exist_ok=True)
    with contextlib.chdir(root):
        result = sft(synthetic_project.settings(root))
    return root, result


def _copy_project(template: Path, project: Path, synthetic_project: SyntheticProject) -> Settings:
    """A test's own copy of a session-built project (its files may be changed), in its cwd."""
    # not MLflow's artifact folder: the session's experiment may have been created there
    shutil.copytree(template, project, dirs_exist_ok=True, ignore=shutil.ignore_patterns("mlruns"))
    return synthetic_project.settings(project)


@pytest.fixture
def prepared(
    project: Path, _prepared_template: Path, synthetic_project: SyntheticProject
) -> Settings:
    """The synthetic project ready to train: raw → validated → splits → random embeddings →
    SIDs → SASRec (built once per session; each test gets its own copy as cwd)."""
    return _copy_project(_prepared_template, project, synthetic_project)


@pytest.fixture
def trained(
    project: Path,
    _trained_template: tuple[Path, StageResult],
    synthetic_project: SyntheticProject,
) -> Settings:
    """``prepared`` with its SFT model and ``metrics/sft.json`` (trained once per session on
    ``synthetic_project``'s settings; each test gets its own copy as cwd)."""
    return _copy_project(_trained_template[0], project, synthetic_project)


LONGEST_FIRST = (
    "tests/test_end_to_end.py",
    "tests/test_dvc.py",
    "tests/integration/test_servers.py",
    "tests/test_faults.py",
)
"""Files of the slow tests that take minutes each (`make test`'s ``--durations``), longest
first: xdist hands them out before the rest, so no worker starts one while the other is idle at
the end of the suite. Only files without module-scoped fixtures: moving some of a module's
tests away from the others would build such a fixture twice."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`) the slow tests of ``LONGEST_FIRST`` are handed out first.

    The tests of the session's SFT model (``trained``) are not kept on one worker: each worker
    that runs one builds the model once, and grouping them on one worker did not shorten the
    suite, so they are spread like the rest."""
    # a moved or renamed file would silently drop out of the order: name it instead
    if missing := [path for path in LONGEST_FIRST if not (REPO / path).is_file()]:
        raise pytest.UsageError(
            f"tests/conftest.py: LONGEST_FIRST names {missing}, which do not exist; give the "
            "slow test files' paths relative to the repository root"
        )
    if config.pluginmanager.hasplugin("xdist"):

        def rank(item: pytest.Item) -> int:
            path = item.nodeid.split("::")[0]
            slow = item.get_closest_marker("slow") is not None
            return (
                LONGEST_FIRST.index(path) if slow and path in LONGEST_FIRST else len(LONGEST_FIRST)
            )

        items.sort(key=rank)  # stable: the rest keep their order


# ---------------------------------------------------------------- Prefect, and files unchanged


@pytest.fixture
def files_under(project: Path):
    """Snapshot of files under a folder (relative paths → mtime) to assert nothing changed."""

    def snapshot(sub: str = "data") -> dict[str, float]:
        root = project / sub
        return (
            {
                str(p.relative_to(project)): p.stat().st_mtime_ns
                for p in root.rglob("*")
                if p.is_file()
            }
            if root.exists()
            else {}
        )

    return snapshot


def _active_slots(name: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name).active_slots
        except ObjectNotFound:
            return 0


@pytest.fixture(scope="session")
def active_slots() -> Callable[[str], int]:
    """``active_slots(name)``: the taken slots of a Prefect global concurrency limit on the
    current API (0 until a run creates the limit; flows/lock.py)."""
    return _active_slots


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server (SQLite) for the whole session."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.testing.utilities import prefect_test_harness

    ensure_logging_setup()  # bind Prefect's console handler to the real stderr, not a CliRunner stream

    with prefect_test_harness(server_startup_timeout=120):
        yield
