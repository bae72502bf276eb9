"""Where each stage's files live. The one place paths are spelled out in code;
``dvc.yaml`` builds the same paths from ``params.yaml`` (a test checks they agree)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class DatasetPaths:
    data_dir: Path
    metrics_dir: Path
    dataset: str
    artifacts_dir: Path = Path("artifacts")

    @property
    def raw_dir(self) -> Path:
        return self.data_dir / "raw" / self.dataset

    @property
    def validated_dir(self) -> Path:
        return self.data_dir / "validated" / self.dataset

    @property
    def processed_dir(self) -> Path:
        return self.data_dir / "processed" / self.dataset

    def raw(self, table: str) -> Path:
        return self.raw_dir / f"{table}.parquet"

    def validated(self, table: str) -> Path:
        return self.validated_dir / f"{table}.parquet"

    def split(self, name: str) -> Path:
        return self.processed_dir / f"{name}.parquet"

    @property
    def drift_dir(self) -> Path:
        """What the last accepted loads looked like: validate compares each new load with it
        (``metrics/drift.json``) and keeps it beside the data, since the raw tables it came
        from are gone once the next load is ingested."""
        return self.data_dir / "drift" / self.dataset

    @property
    def load_profiles(self) -> Path:
        """Interactions per user and per catalog item of the last accepted load and of the
        one before it (``sidrec.schemas.LOAD_PROFILE``)."""
        return self.drift_dir / "profiles.parquet"

    @property
    def load_summaries(self) -> Path:
        """The same two loads' sizes, time ranges and content hashes."""
        return self.drift_dir / "profiles.json"

    @property
    def item_emb(self) -> Path:
        return self.processed_dir / "item_emb.npy"

    @property
    def item_emb_manifest(self) -> Path:
        return self.processed_dir / "item_emb.json"

    @property
    def sids_dir(self) -> Path:
        return self.data_dir / "sids" / self.dataset

    @property
    def sid_map(self) -> Path:
        return self.sids_dir / "sid_map.json"

    @property
    def quantizer(self) -> Path:
        return self.sids_dir / "quantizer.pt"

    @property
    def retired_sids(self) -> Path:
        """SIDs of items that left the catalog since the map's full build (incremental runs
        keep them free; ``{}`` after a full build or an import)."""
        return self.sids_dir / "retired.json"

    @property
    def code_usage_plot(self) -> Path:
        return self.sids_dir / "code_usage.png"

    @property
    def baselines_dir(self) -> Path:
        return self.artifacts_dir / "baselines" / self.dataset

    @property
    def sasrec_model(self) -> Path:
        """The trained SASRec baseline: ``model.pt`` (state_dict) + ``config.json`` (its
        hyperparameters, catalog and best epoch); see ``models.baselines.sasrec.save_sasrec``."""
        return self.baselines_dir / "sasrec"

    @property
    def sasrec_resume(self) -> Path:
        """SASRec's training state after its last epoch while the baselines stage runs: a
        stopped run goes on from there (``models.baselines.sasrec.train_sasrec``); removed
        once the stage's outputs are written. Not a stage output."""
        return self.baselines_dir / "sasrec-resume.pt"

    @property
    def ease_choice(self) -> Path:
        """EASE's L2 and the SASRec + EASE blend's weight, chosen on the validation selection
        half (or why both were left out): evaluate fits EASE on the train split with them
        (``tasks.shared.baselines``)."""
        return self.baselines_dir / "ease.json"

    @property
    def sft_dir(self) -> Path:
        return self.artifacts_dir / "sft" / self.dataset

    @property
    def sft_model(self) -> Path:
        """The fine-tuned model + tokenizer (loads with ``from_pretrained``)."""
        return self.sft_dir / "model"

    @property
    def grpo_dir(self) -> Path:
        return self.artifacts_dir / "grpo" / self.dataset

    @property
    def grpo_model(self) -> Path:
        """The RL-tuned model + tokenizer (the best checkpoint by validation NDCG@10)."""
        return self.grpo_dir / "model"

    @property
    def grpo_kept_step(self) -> Path:
        """Inside the GRPO model folder: the validation step that model is (0: its SFT start).
        It travels with the weights, so evaluate's choice of the best generative model reads
        the model alone, never the run's timings in ``metrics/grpo.json``."""
        return self.grpo_model / "kept_step.json"

    def metrics(self, stage: str) -> Path:
        return self.metrics_dir / f"{stage}.json"

    @property
    def eval_users(self) -> Path:
        """Per-user scores behind ``metrics/eval.json`` (split, model, user_id, metrics, ranking)."""
        return self.metrics_dir / "eval_users.parquet"
