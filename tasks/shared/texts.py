"""Item texts from a ``str.format`` template over the catalog's fields: what the embed stage
encodes (``embed.template``) and what SFT teaches for each item (``sft.item_text``)."""

from __future__ import annotations

import string

import pandas as pd

from sidrec.errors import ConfigError


def render_texts(items: pd.DataFrame, template: str | None, key: str) -> list[str]:
    """One text per item: the template filled with the item's fields (missing values → "");
    null renders every field as ``name: value`` lines. ``key``: the setting the template comes
    from, named when it uses a field the catalog lacks."""
    fields = [c for c in items.columns if c != "item_id"]
    records = items[fields].astype("string").fillna("").to_dict("records")
    if template is None:
        return ["\n".join(f"{k}: {v}" for k, v in r.items() if v.strip()) for r in records]
    used = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    unknown = sorted(used - set(fields))
    if unknown:
        raise ConfigError(
            f"{key} uses field(s) {unknown} that the catalog lacks; available: {fields}"
        )
    return [template.format_map(r).strip() for r in records]
