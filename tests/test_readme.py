"""The README documents every setting with its real default (the Configuration table)."""

from __future__ import annotations

import re
from pathlib import Path

from service.settings import Settings

README = Path(__file__).resolve().parents[1] / "README.md"


def documented() -> dict[str, str]:
    """Variable -> its default cell, from the Configuration table (`A` / `B` rows give each its part)."""
    text = README.read_text()
    table = text[text.index("## Configuration") :]
    table = table[: table.index("\n## ", 5)]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Z_]+)`", cells[0])
        defaults = [d.strip() for d in cells[1].split(" / ")] if len(names) > 1 else [cells[1]]
        rows.update(zip(names, defaults, strict=True))
    return rows


def shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "empty" if not value else "`" + ",".join(f"{v:g}" for v in value) + "`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def test_every_setting_is_documented_with_its_default() -> None:
    rows = documented()
    for name, field in Settings.model_fields.items():
        variable = name.upper()
        assert variable in rows, f"{variable} is not in README's Configuration table"
        assert rows[variable] == shown(field.default), (variable, rows[variable], shown(field.default))


def test_quality_table_gives_the_default_step_budgets() -> None:
    """The README's quality table states each model's step budget as the default profile has it."""
    from model_export.profiles import MODEL_NAMES, recipe_for

    text = README.read_text()
    table = text[text.index("## Model quality") :]
    table = table[: table.index("\n## ", 5)]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in MODEL_NAMES:
            rows[cells[0]] = cells
    assert set(rows) == set(MODEL_NAMES)
    for name, cells in rows.items():
        steps = int(cells[-1].replace(",", "").split()[0])
        assert steps == recipe_for("default", name).train.steps, (name, cells[-1])
