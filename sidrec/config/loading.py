"""Reading ``params.yaml``: ``--set`` overrides, the chosen dataset profile and preset, readable
validation errors, and the resolved configuration each run saves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sidrec.config.data import SOURCES, IngestConfig, chosen_profile, source_dataset
from sidrec.config.settings import Settings
from sidrec.errors import ConfigError

DEFAULT_PARAMS = Path("params.yaml")
DEFAULT_SOURCE = IngestConfig.model_fields["source"].default


def literal_override(key: str, value: object) -> str:
    """``key=value`` with the value taken as text, as a flag means it (``--dataset 2023`` is
    the name "2023", a path may hold ``#``): quoted, so the YAML of :func:`parse_override`
    reads it back unchanged."""
    return f"{key}={json.dumps(str(value))}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"split.max_history=10"`` → (["split", "max_history"], 10); the value is YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key.strip()):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({exc})") from None
    return key.strip().split("."), value


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each ``section.key=value`` override set."""
    return set_keys(raw, [parse_override(text) for text in overrides])


def set_keys(raw: Mapping[str, Any], keys: Iterable[tuple[list[str], Any]]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each ``(["section", "key"], value)`` set."""
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(raw))) or {}
    for path, value in keys:
        node = data
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(path)}: '{key}' is not a section")
            node = child
        node[path[-1]] = value
    return data


def load_settings(path: Path | str = DEFAULT_PARAMS, overrides: Iterable[str] = ()) -> Settings:
    """Read ``params.yaml``, apply overrides, validate. Raises :class:`ConfigError`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path}: configuration file not found (run from the project root or pass --config)"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; --config takes a params.yaml file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    overrides = list(overrides)
    origin = f"{path} with --set overrides" if overrides else str(path)
    return settings_from_dict(with_layers(raw, overrides), origin=origin)


def with_layers(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with the overrides, then the dataset profile's keys, the preset's keys over those
    and the overrides again over both (so ``--set`` wins).

    The profile and the preset are the ones ``project.profile`` and ``project.preset`` name
    after the overrides (``--set project.preset=quality`` chooses one); their keys come from
    ``profiles.<name>`` and ``presets.<name>``."""
    data = _default_dataset(raw, apply_overrides(raw, overrides), overrides)
    source = _get(data, "ingest", "source", DEFAULT_SOURCE)
    profile = _get(data, "project", "profile", "auto")
    chosen = [
        ("profiles", chosen_profile(profile, source) if isinstance(profile, str) else None),
        ("presets", _get(data, "project", "preset", "default")),
    ]
    keys: list[tuple[list[str], Any]] = []
    for kind, name in chosen:
        defined = data.get(kind) or {}
        if not isinstance(name, str) or not isinstance(defined, dict) or name not in defined:
            continue  # the settings model reports a bad project section or an unknown name
        if not isinstance(defined[name], dict):
            raise ConfigError(f"{kind}.{name}: expected a mapping of section.key: value")
        keys += [(str(key).split("."), value) for key, value in defined[name].items()]
    return apply_overrides(set_keys(data, keys), overrides) if keys else data


def _default_dataset(
    raw: Mapping[str, Any], data: dict[str, Any], overrides: list[str]
) -> dict[str, Any]:
    """``data`` with ``project.dataset`` the source's (:func:`source_dataset`) where the
    overrides change ``ingest.source`` and name no dataset."""
    source = _get(data, "ingest", "source", DEFAULT_SOURCE)
    named = {tuple(parse_override(text)[0][:2]) for text in overrides}
    if (
        source not in SOURCES  # the settings model reports it
        or source == _get(raw, "ingest", "source", DEFAULT_SOURCE)
        or {("project",), ("project", "dataset")} & named
    ):
        return data
    return set_keys(data, [(["project", "dataset"], source_dataset(source))])


def _get(data: Mapping[str, Any], section: str, key: str, default: Any) -> Any:
    """``data[section][key]``, or ``default`` where the section or the key is absent (a
    malformed section is the settings model's to report)."""
    node = data.get(section)
    return node.get(key, default) if isinstance(node, dict) else default


def settings_from_dict(data: Mapping[str, Any], origin: str = "params") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin)) from None


RENAMED_KEYS: dict[str, str] = {
    "evaluate.sasrec_max_epochs": "sasrec.max_epochs",
    "evaluate.sasrec_patience": "sasrec.patience",
    "register.num_beams": "evaluate.num_beams (the served model decodes as evaluated)",
}
"""Keys that moved (old → new): a config that still uses an old key is told the new one."""


def format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = [f"{origin}: {exc.error_count()} invalid setting(s):"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and where in RENAMED_KEYS:
            lines.append(f"  - {where} was renamed: use {RENAMED_KEYS[where]}")
            continue
        if err["type"] == "value_error":  # our validators' own message, without pydantic's prefix
            msg = str(err["ctx"]["error"])
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against params.yaml)"
        elif (
            "input" in err
            and err["type"] not in ("missing",)
            and not isinstance(err["input"], dict)
            and "got " not in msg  # the message shows the value already
        ):
            msg += f" (got {err['input']!r})"
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def dump_settings(settings: Settings, path: Path) -> None:
    """The resolved configuration as a file ``load_settings`` reads back as ``settings``: the
    chosen profile's and preset's keys hold the values the sections have (an override may have
    changed one), so applying them again changes nothing."""
    from sidrec.io import atomic_write_text

    data = settings.to_yaml_dict()
    for kind, layers, name in (
        ("profiles", settings.profiles, settings.profile),
        ("presets", settings.presets, settings.project.preset),
    ):
        if name in layers:
            data[kind][name] = {key: settings.section(key) for key in layers[name]}
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


def save_run_config(settings: Settings, command: str) -> Path:
    """Save the resolved configuration of a run under ``runs/<UTC time>-<command>/params.yaml``."""
    import datetime as dt

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = settings.project.runs_dir / f"{stamp}-{command}" / "params.yaml"
    dump_settings(settings, path)
    return path
