from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from sidrec.config import Settings
from sidrec.settings_reference import COMMAND, main, render

REPO = Path(__file__).resolve().parents[2]


def test_docs_settings_md_is_up_to_date():
    rendered = render(REPO / "params.yaml")
    written = (REPO / "docs" / "settings.md").read_text()
    assert written == rendered, f"docs/settings.md is stale: run {COMMAND}"


def _keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str | None]]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            assert kind.__doc__, f"section {key} has no docstring"
            keys += _keys(kind, key + ".")
        else:
            keys.append((key, field.description))
    return keys


def test_every_setting_is_explained_once_in_the_reference():
    keys = _keys(Settings)
    undocumented = [key for key, doc in keys if not doc]
    assert not undocumented, f"settings without a docstring in sidrec/config/: {undocumented}"
    rendered = render(REPO / "params.yaml")
    for key, _ in keys:
        if key in ("presets", "profiles"):  # a section of their own, with their definitions
            assert rendered.count(f"\n## {key}\n") == 1, key
        else:
            assert rendered.count(f"- **`{key}`** ·") == 1, key


def test_a_default_params_yaml_disagrees_with_is_named(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["split"]["max_history"] = 7
    changed = tmp_path / "params.yaml"
    changed.write_text(yaml.safe_dump(params))
    with pytest.raises(ValueError, match=r"params.yaml has split.max_history: 7, the model's"):
        render(changed)


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    out = tmp_path / "settings.md"
    params = ["--params", str(REPO / "params.yaml"), "--out", str(out)]
    assert main([*params, "--check"]) == 1
    assert f"is stale: run {COMMAND}" in capsys.readouterr().err
    assert main(params) == 0
    assert main([*params, "--check"]) == 0
