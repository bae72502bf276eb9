"""Stages 8-9 (evaluate, register) and where the stages run (``orchestration``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sidrec.config.base import _Section


class EvaluateConfig(_Section):
    """Stage 8: full-catalog HR/NDCG for the model and the baselines."""

    ks: list[int] = Field([1, 5, 10, 20])
    """Cut-offs K of HR@K and NDCG@K: distinct, each >= 1 (``register.gate_metric``'s K among
    them)."""
    num_beams: int = Field(20, ge=1)
    """Constrained beam width: the beams are the ranked list, so at least the largest K. SFT's
    and GRPO's validations and the served model decode with it too."""
    batch_size: int = Field(16, ge=1)
    """Prompts per generate() call (each expands to num_beams rows)."""
    max_users: int | None = Field(None, ge=1)
    """Evaluate on the first N rows of each split (null = all)."""
    exclude_seen: bool = True
    """Every model ranks only items outside the user's whole pre-target history (all train
    interactions, plus the valid target when scoring test), as RecBole and most papers do;
    false keeps already-seen items rankable (datasets with repeat consumption)."""
    bootstrap_resamples: int = Field(1000, ge=100)
    """Resamples of users for the 95% bootstrap intervals (per model and paired differences)."""

    @model_validator(mode="after")
    def _cutoffs(self) -> EvaluateConfig:
        if not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise ValueError(
                f"ks must be distinct cut-offs >= 1, e.g. [1, 5, 10, 20]; got {self.ks}"
            )
        if self.num_beams < max(self.ks):
            raise ValueError(
                f"num_beams ({self.num_beams}) must be >= the largest K in ks ({max(self.ks)}): "
                "the beams are the ranked list"
            )
        return self


class RegisterConfig(_Section):
    """Stage 9: log the recommender as an MLflow pyfunc model, register it, gate promotion."""

    enabled: bool = True
    """true: log the candidate to MLflow as a pyfunc model, register it and run the promotion
    gate; false skips registration (nothing is logged to the model registry)."""
    model_name: str | None = None
    """Registered model name; null = ``sidrec-<dataset>``."""
    candidate: Literal["auto", "grpo", "sft"] = "auto"
    """Which trained model is registered: auto = evaluate's ``best_generative`` (metrics/eval.json),
    picked on the validation selection half: GRPO where its validation kept a step past its
    SFT start, else SFT; the gate half stays independent of that choice."""
    gate_metric: str = "valid.ndcg@10"
    """``valid.<hr|ndcg>@K``: the metric the gate compares, user by user, on the gate half of
    the validation users (the half no checkpoint was selected on). Test is reported, never
    used to choose: a ``test.*`` gate metric is refused."""
    min_margin: float = Field(0.0, ge=0)
    """Promote only if the lower bound of the paired bootstrap interval of (challenger −
    champion) exceeds this."""
    confidence: float = Field(0.95, gt=0.5, lt=1)
    """Confidence of that paired bootstrap interval (two-sided)."""
    gate_best_baseline: bool = True
    """Refuse to promote a candidate that trails the best baseline: evaluate's
    ``best_baseline`` (popularity, SASRec, EASE or the blend with the best NDCG@10 on the gate
    half), compared user by user on the gate users on ``gate_metric``, refuses the candidate
    when the paired interval of (candidate − best baseline) at ``confidence`` lies entirely
    below 0, even with no champion yet; the version is still registered (alias
    ``challenger``) and the report says why. false: the champion comparison alone decides."""
    top_k: int = Field(10, ge=1)
    """Items the served model returns per history unless the request asks otherwise. The
    served model decodes with ``evaluate.num_beams`` and excludes the history under
    ``evaluate.exclude_seen``: what is evaluated is what is served."""

    @field_validator("gate_metric")
    @classmethod
    def _gate_metric(cls, value: str) -> str:
        if value.startswith("test."):
            raise ValueError(
                f"{value!r} would choose the model on the test split; the gate decides on "
                f"validation: use {'valid.' + value.split('.', 1)[1]!r} (test is reported, never "
                "used to choose)"
            )
        if not re.fullmatch(r"valid\.(hr|ndcg)@[1-9]\d*", value):
            raise ValueError(
                f"unknown gate metric {value!r}; expected valid.<hr|ndcg>@K, e.g. valid.ndcg@10"
            )
        return value


class OrchestrationConfig(_Section):
    """Where the stages run (Prefect): everything inline, or training on the ``gpu`` work pool."""

    gpu_deployment: str | None = None
    """``<flow>/<deployment>`` that runs the training stages (baselines, sft, grpo, evaluate)
    on the ``gpu`` pool (``prefect.yaml`` defines ``train-remote/train-gpu``); null runs them
    inline in the parent flow."""
    gpu_timeout_s: int = Field(86_400, ge=60)
    """How long the parent flow waits for the training deployment's run."""
    lock_timeout_s: int = Field(86_400, ge=1)
    """How long a retrain waits for another retrain of the same dataset to end (the Prefect
    global concurrency limit ``sidrec-retrain-<dataset>``, ``flows/lock.py``) before it fails.
    Only with a Prefect server: without ``PREFECT_API_URL`` runs do not wait for each other."""
    accelerate_config: Path | None = None
    """An Accelerate config file (``docker/accelerate/ddp.yaml``, ``deepspeed_zero2.yaml``,
    ``fsdp.yaml``): the flow runs sft and grpo as ``accelerate launch --config_file <it> -m
    sidrec <stage>`` subprocesses, several training processes (one per GPU); null trains them in
    the flow's own process. The ``train-gpu`` deployment sets it."""
    num_processes: int | None = Field(None, ge=1)
    """Processes ``accelerate launch`` starts (null: one per visible GPU, at least one).
    ``sft.batch_size`` and ``grpo.prompts_per_step`` stay per optimizer step: each process
    takes an equal share, so they must be multiples of it."""
