"""What every stage shares: its result type, the config keys it reads and the files it reads.

The same tables drive Prefect's cache keys and are checked against ``dvc.yaml``'s
``params``/``deps`` by the tests, so the two orchestrators agree on what a stage depends on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from sidrec.config import Settings
from sidrec.io import file_sha256

Stage = Literal[
    "ingest",
    "validate",
    "split",
    "embed",
    "sids",
    "baselines",
    "sft",
    "grpo",
    "evaluate",
    "register",
]
STAGES: tuple[Stage, ...] = get_args(Stage)
"""The stages in run order."""

STAGE_PARAMS: dict[Stage, tuple[str, ...]] = {
    "ingest": ("project.dataset", "ingest"),
    "validate": ("project.dataset", "validate"),
    # a dataset profile may set keys of split, sids, sasrec, model, sft and grpo
    "split": ("project.dataset", "project.profile", "profiles", "split"),
    "embed": ("project.dataset", "embed"),
    "sids": ("project.dataset", "project.seed", "project.profile", "profiles", "sids"),
    # SASRec, EASE and the blend are chosen as evaluate ranks (seen-item exclusion)
    "baselines": (
        "project.dataset",
        "project.seed",
        "project.profile",
        "profiles",
        "split.max_history",
        "sasrec",
        "ease",
        "evaluate.exclude_seen",
    ),
    # sft and grpo validate as evaluate ranks: its beams, batch size and seen-item exclusion;
    # sft sizes the SID vocabulary by sids.codebook_size
    "sft": (
        "project.dataset",
        "project.seed",
        "project.profile",
        "profiles",
        "project.preset",
        "presets",
        "split.max_history",
        "sids.codebook_size",
        "model",
        "sft",
        "grpo.ease_l2",
        "grpo.ease_recency",
        "evaluate.num_beams",
        "evaluate.batch_size",
        "evaluate.exclude_seen",
    ),
    "grpo": (
        "project.dataset",
        "project.seed",
        "project.profile",
        "profiles",
        "project.preset",
        "presets",
        "split.max_history",
        "model",
        "grpo",
        "evaluate.num_beams",
        "evaluate.batch_size",
        "evaluate.exclude_seen",
    ),
    "evaluate": (
        "project.dataset",
        "project.seed",
        "project.profile",
        "profiles",
        "project.preset",
        "presets",
        "split.method",
        "split.max_history",
        "model.max_length",
        "grpo.enabled",
        "evaluate",
    ),
    # register re-scores the champion as evaluate scored the candidate
    "register": (
        "project.dataset",
        "project.seed",
        "project.profile",
        "profiles",
        "project.preset",
        "presets",
        "split.max_history",
        "model.max_length",
        "grpo.enabled",
        "evaluate",
        "register",
    ),
}
"""``params.yaml`` keys each stage reads (``dvc.yaml`` lists the same)."""

OUTPUT_PLACES = ("project.data_dir", "project.metrics_dir", "project.artifacts_dir")
"""Where stages write: part of every Prefect cache key (not ``project.runs_dir``, which holds
only each run's record, nor a preset the stage does not read)."""


@dataclass(frozen=True)
class StageResult:
    """What a stage function returns: its outputs (path → sha256), its metrics and a one-line
    summary of them (the row of the run's summary table)."""

    stage: Stage
    outputs: dict[str, str]
    metrics: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    @classmethod
    def from_files(
        cls, stage: Stage, files: list[Path], metrics: dict[str, Any], summary: str = ""
    ) -> StageResult:
        outputs = {str(p): file_sha256(p) for p in files}
        return cls(stage=stage, outputs=outputs, metrics=metrics, summary=summary)

    def outputs_intact(self) -> bool:
        """True when every output still exists with the content this run wrote."""
        return all(Path(p).exists() and file_sha256(Path(p)) == h for p, h in self.outputs.items())


def dataset_line(metrics: dict[str, Any]) -> str:
    """The summary of a table-producing stage (ingest, validate): users, items, interactions."""
    m = metrics
    return f"{m['users']:,} users · {m['items']:,} items · {m['interactions']:,} interactions"


def reaches(until: Stage, stage: Stage) -> bool:
    """True when a run that stops after ``until`` includes ``stage``."""
    return STAGES.index(stage) <= STAGES.index(until)


def stage_inputs(stage: Stage, settings: Settings) -> list[Path]:
    """The data files a stage reads (code and params are tracked separately)."""
    paths = settings.paths
    if stage == "ingest":
        from sidrec.sources import source_files

        return source_files(settings.ingest)
    if stage == "validate":
        return [paths.raw("interactions"), paths.raw("items")]
    if stage == "split":
        return [paths.validated("interactions"), paths.validated("items")]
    if stage == "embed":  # and a local encoder folder's files (a model replaced in it)
        folder = settings.embed.encoder_folder()
        return [paths.validated("items"), *(_files(folder, every=True) if folder else [])]
    if stage == "baselines":
        return [paths.validated("items"), *(paths.split(s) for s in ("train", "valid"))]
    if stage == "sft":
        return [
            paths.validated("items"),
            paths.sid_map,
            *(paths.split(s) for s in ("train", "valid")),
            *(_files(paths.sasrec_model) if settings.sft.distill > 0 else []),  # the teacher
        ]
    if stage == "grpo":
        return [
            paths.validated("items"),
            paths.sid_map,
            paths.item_emb,
            *(paths.split(s) for s in ("train", "valid")),
            *_files(paths.sft_model),
            *(_files(paths.sasrec_model) if _grpo_reads_sasrec(settings) else []),
        ]
    if stage == "evaluate":
        return [
            paths.validated("items"),
            paths.sid_map,
            *(paths.split(s) for s in ("train", "valid", "test")),
            *_files(paths.sasrec_model),
            paths.ease_choice,
            *_files(paths.sft_model),
            # with GRPO's kept step (in its model folder: it decides the best generative model)
            *(_files(paths.grpo_model) if settings.grpo.enabled else []),
        ]
    if stage == "register":
        return [
            paths.metrics("eval"),
            paths.eval_users,
            *(paths.split(s) for s in ("train", "valid", "test")),
            paths.validated("items"),
            paths.sid_map,
            *_files(paths.sft_model),
            *(_files(paths.grpo_model) if settings.grpo.enabled else []),
            # the best baseline's scores must come from today's baselines
            *(
                [*_files(paths.sasrec_model), paths.ease_choice]
                if settings.register_.gate_best_baseline
                else []
            ),
        ]
    files = [paths.item_emb, paths.item_emb_manifest, paths.validated("items")]
    if settings.sids.embedding != "text":  # collaborative factors come from the train split
        files.append(paths.split("train"))
    if settings.sids.incremental:  # incremental mode extends the existing map
        files += [paths.sid_map, paths.retired_sids, paths.quantizer]
    if settings.sids.import_index is not None:
        files.append(settings.sids.import_index)
    return files


def _files(folder: Path, every: bool = False) -> list[Path]:
    """The files of a model folder (none if it does not exist yet); ``every``: its
    subfolders' too."""
    if not folder.is_dir():
        return []
    return sorted(p for p in (folder.rglob("*") if every else folder.glob("*")) if p.is_file())


def stage_fingerprint(stage: Stage, settings: Settings) -> str:
    """Hash of what decides a stage's outputs: its params, its input files and the code."""
    digest = hashlib.sha256(stage.encode())
    for key in (*STAGE_PARAMS[stage], *OUTPUT_PLACES):
        digest.update(f"{key}={settings.section(key)!r}".encode())
    for path in stage_inputs(stage, settings):
        digest.update(str(path).encode())
        digest.update(file_sha256(path).encode() if path.exists() else b"<missing>")
    if stage == "sft" and settings.sft.warm_start == "champion":
        from sidrec.registry import champion_label  # a new champion: a new starting point

        digest.update(champion_label(settings).encode())
    if stage == "register":  # another registry: another result (flows check it still holds it)
        from sidrec.tracking import tracking_uri

        digest.update(tracking_uri().encode())
    digest.update(code_fingerprint().encode())
    return digest.hexdigest()


def code_fingerprint() -> str:
    """Hash of the project's Python sources (any code change invalidates cached stages)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in ("sidrec", "tasks", "models"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _grpo_reads_sasrec(settings: Settings) -> bool:
    """GRPO reads SASRec for its collaborative reward, and as the teacher in its SFT anchor."""
    grpo = settings.grpo
    anchor_teacher = grpo.sft_anchor > 0 and settings.sft.distill > 0
    return grpo.rewards.collaborative > 0 or anchor_teacher
