"""The one configuration: ``params.yaml`` → one strict, frozen settings model.

Every section belongs to one stage (``project`` holds what all stages share) and is declared,
with a docstring per key, in the module of its stage group: :mod:`sidrec.config.data`
(``project`` and stages 1-5), :mod:`sidrec.config.training` (5b-7) and
:mod:`sidrec.config.release` (8-9, ``orchestration``). :mod:`sidrec.config.settings` joins them
into :class:`Settings` with the checks across sections; :mod:`sidrec.config.loading` reads the
file. DVC reads the same file for its per-key ``params``; Prefect flows and the CLI load it
through :func:`load_settings`, which applies ``--set section.key=value`` overrides first.
``python -m sidrec.settings_reference`` renders every key into ``docs/settings.md``.
"""

from sidrec.config.data import (
    BUILT_IN_SOURCES,
    BUNDLED_ENCODERS,
    SOURCES,
    AmazonConfig,
    EmbedConfig,
    IngestConfig,
    ProjectConfig,
    RQKMeansConfig,
    RQVAESection,
    SidsConfig,
    SplitConfig,
    ValidateConfig,
    chosen_profile,
    source_dataset,
)
from sidrec.config.loading import (
    DEFAULT_PARAMS,
    RENAMED_KEYS,
    apply_overrides,
    dump_settings,
    format_validation_error,
    literal_override,
    load_settings,
    parse_override,
    save_run_config,
    set_keys,
    settings_from_dict,
    with_layers,
)
from sidrec.config.release import EvaluateConfig, OrchestrationConfig, RegisterConfig
from sidrec.config.settings import PRESET_SECTIONS, PROFILE_SECTIONS, Settings
from sidrec.config.training import (
    EaseConfig,
    GrpoConfig,
    GrpoRewardWeights,
    LoraConfig,
    ModelConfig,
    SasrecConfig,
    SftConfig,
    TinyModelConfig,
)

__all__ = [
    "BUILT_IN_SOURCES",
    "BUNDLED_ENCODERS",
    "DEFAULT_PARAMS",
    "PRESET_SECTIONS",
    "PROFILE_SECTIONS",
    "RENAMED_KEYS",
    "SOURCES",
    "AmazonConfig",
    "EaseConfig",
    "EmbedConfig",
    "EvaluateConfig",
    "GrpoConfig",
    "GrpoRewardWeights",
    "IngestConfig",
    "LoraConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "ProjectConfig",
    "RQKMeansConfig",
    "RQVAESection",
    "RegisterConfig",
    "SasrecConfig",
    "Settings",
    "SftConfig",
    "SidsConfig",
    "SplitConfig",
    "TinyModelConfig",
    "ValidateConfig",
    "apply_overrides",
    "chosen_profile",
    "dump_settings",
    "format_validation_error",
    "literal_override",
    "load_settings",
    "parse_override",
    "save_run_config",
    "set_keys",
    "settings_from_dict",
    "source_dataset",
    "with_layers",
]
