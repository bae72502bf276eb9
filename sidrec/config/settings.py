"""The whole of ``params.yaml``: the sections, the presets and the checks across sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from sidrec.config.base import _Section
from sidrec.config.data import (
    BUILT_IN_SOURCES,
    EmbedConfig,
    IngestConfig,
    ProjectConfig,
    SidsConfig,
    SplitConfig,
    ValidateConfig,
    chosen_profile,
    source_dataset,
)
from sidrec.config.release import EvaluateConfig, OrchestrationConfig, RegisterConfig
from sidrec.config.training import EaseConfig, GrpoConfig, ModelConfig, SasrecConfig, SftConfig
from sidrec.paths import DatasetPaths

PRESET_SECTIONS = ("model", "sft", "grpo")
"""What a preset may change: the generative model and its training. The data, the SIDs and the
SASRec baseline are the same under every preset, so presets compare on one split against
one baseline."""
PROFILE_SECTIONS = ("split", "sasrec", "sids", *PRESET_SECTIONS)
"""What a dataset profile may change: the split's protocol, the baseline and the SIDs for that
data, and the generative model's sizes."""


class Settings(_Section):
    """The whole of ``params.yaml``."""

    project: ProjectConfig = ProjectConfig()
    ingest: IngestConfig = IngestConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    split: SplitConfig = SplitConfig()
    embed: EmbedConfig = EmbedConfig()
    sids: SidsConfig = SidsConfig()
    sasrec: SasrecConfig = SasrecConfig()
    ease: EaseConfig = EaseConfig()
    model: ModelConfig = ModelConfig()
    sft: SftConfig = SftConfig()
    grpo: GrpoConfig = GrpoConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    register_: RegisterConfig = Field(RegisterConfig(), alias="register")
    orchestration: OrchestrationConfig = OrchestrationConfig()
    presets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """``{name: {"section.key": value}}``: named sets of keys that ``project.preset`` applies,
    keys of ``model``, ``sft`` and ``grpo`` only (:data:`PRESET_SECTIONS`: the data, the SIDs
    and the SASRec baseline are the same under every preset, so presets compare on one split).
    ``params.yaml`` defines them; its ``quality`` is for GPU workers or a patient CPU (about an
    hour a seed on 2 CPU cores): a 4.6M-parameter decoder (hidden 256 × 4 layers) with dropout
    0.1, 10 SFT epochs of plain windows whose last model is kept (one validation, at the end),
    and 600 GRPO steps (docs/benchmarks.md, experiment index:
    "``quality`` preset re-sized")."""

    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """``{name: {"section.key": value}}``: dataset profiles, the keys ``project.profile``
    applies before the preset, keys of ``split``, ``sasrec``, ``sids``, ``model``, ``sft`` and
    ``grpo`` only (:data:`PROFILE_SECTIONS`). ``params.yaml`` defines one
    per built-in source but movielens-100k, each the protocol of the published tables on that
    data: ``movielens-1m``, leave-one-out over histories of up to 200 items, SASRec reading all
    of them (SASRec, HSTU); ``amazon-beauty``, histories of up to 20 items (TIGER). The other
    sections keep ml-100k's values until a measured reason changes one."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True
    )

    @field_validator("presets")
    @classmethod
    def _preset_keys(cls, presets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if "default" in presets:
            raise ValueError("'default' is the sections as written; name presets otherwise")
        return _layer_keys(
            presets, "preset", PRESET_SECTIONS, "baselines and data stay as they are"
        )

    @field_validator("profiles")
    @classmethod
    def _profile_keys(cls, profiles: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if reserved := {"auto", "none"} & set(profiles):
            raise ValueError(f"{', '.join(sorted(reserved))}: reserved by project.profile")
        return _layer_keys(profiles, "profile", PROFILE_SECTIONS, "the rest is the same data's")

    @model_validator(mode="after")
    def _cross_section(self) -> Settings:
        if self.project.preset != "default" and self.project.preset not in self.presets:
            defined = ", ".join(["default", *self.presets])
            raise ValueError(f"project.preset: unknown preset {self.project.preset!r} ({defined})")
        self._check_profile()
        self._check_dataset_name()
        sections = self.to_yaml_dict()
        for kind, layers in (("presets", self.presets), ("profiles", self.profiles)):
            for name, keys in layers.items():  # a typo shows now, not when it is chosen
                unknown = [key for key in keys if not _has_key(sections, key)]
                if unknown:
                    raise ValueError(
                        f"{kind}.{name}: unknown key(s) {', '.join(unknown)} "
                        "(check the spelling against params.yaml)"
                    )
        gate_k = int(self.register_.gate_metric.rsplit("@", 1)[1])
        if self.register_.enabled and gate_k not in self.evaluate.ks:
            raise ValueError(
                f"register.gate_metric {self.register_.gate_metric} needs K={gate_k} in "
                f"evaluate.ks {self.evaluate.ks} (evaluate writes the per-user scores it compares)"
            )
        if self.split.method == "leave_one_out" and self.validate_.min_user_interactions < 3:
            raise ValueError(
                "split.method leave_one_out needs validate.min_user_interactions >= 3 "
                "(one item each for train, valid and test)"
            )
        self._check_anchor()
        return self

    def _check_profile(self) -> None:
        """The profile ``project.profile`` chooses is defined."""
        name, source = self.profile, self.ingest.source
        if name is not None and name not in self.profiles:
            defined = ", ".join(["auto", "none", *self.profiles])
            if self.project.profile == "auto":
                raise ValueError(
                    f"project.profile: auto applies source {source}'s own profile, but "
                    f"profiles defines no {name!r} (defined: {', '.join(self.profiles) or 'none'}"
                    "); copy it from the repository's params.yaml, or set project.profile: none"
                )
            raise ValueError(f"project.profile: unknown profile {name!r} ({defined})")

    def _check_dataset_name(self) -> None:
        """A built-in source never writes into another built-in source's folders (as
        ``dvc exp run -S ingest.source=...`` alone would)."""
        source = self.ingest.source
        others = {source_dataset(s): s for s in BUILT_IN_SOURCES if s != source}
        if source in BUILT_IN_SOURCES and self.project.dataset in others:
            raise ValueError(
                f"project.dataset {self.project.dataset!r} is the folder of source "
                f"{others[self.project.dataset]}, but ingest.source is {source}; set "
                f"project.dataset (e.g. {source_dataset(source)}: --source without --dataset "
                "sets it)"
            )

    def _check_anchor(self) -> None:
        """GRPO's anchor replays SFT's sequence windows: refused now, not after SFT has
        trained, where SFT trains none."""
        grpo = self.grpo
        if not grpo.enabled or grpo.sft_anchor == 0:
            return
        if self.sft.objective != "sequence":
            raise ValueError(
                f"grpo.sft_anchor is {grpo.sft_anchor} but sft.objective is "
                f"{self.sft.objective!r}: the anchor replays SFT's sequence windows; set "
                "grpo.sft_anchor: 0 (or sft.objective: sequence)"
            )

    @property
    def profile(self) -> str | None:
        """The dataset profile in force (``project.profile`` resolved), or None."""
        return chosen_profile(self.project.profile, self.ingest.source)

    @property
    def paths(self) -> DatasetPaths:
        return DatasetPaths(
            data_dir=self.project.data_dir,
            metrics_dir=self.project.metrics_dir,
            dataset=self.project.dataset,
            artifacts_dir=self.project.artifacts_dir,
        )

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def section(self, dotted: str) -> Any:
        """The value at ``section.key`` (as in ``params.yaml``), JSON-ready."""
        value: Any = self.to_yaml_dict()
        for part in dotted.split("."):
            value = value[part]
        return value


def _layer_keys(
    layers: dict[str, dict[str, Any]], kind: str, allowed: tuple[str, ...], why: str
) -> dict[str, dict[str, Any]]:
    """Each preset or profile sets single keys (``section.key: value``) of ``allowed``."""
    for name, keys in layers.items():
        whole = [k for k, v in keys.items() if "." not in k or isinstance(v, dict)]
        if whole:  # it would replace the section, every key it leaves out at its default
            raise ValueError(
                f"{name}: {', '.join(whole)}: a {kind} key names one setting as "
                f"section.key: value, not a section (to change a {kind}'s key for one run, "
                f"--set that section.key: --set wins over the {kind})"
            )
        outside = [k for k in keys if k.split(".")[0] not in allowed]
        if outside:
            raise ValueError(
                f"{name}: {', '.join(outside)}: a {kind} may set keys of "
                f"{', '.join(allowed)} only ({why})"
            )
    return layers


def _has_key(sections: Mapping[str, Any], dotted: str) -> bool:
    node: Any = sections
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
