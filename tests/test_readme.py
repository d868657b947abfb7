"""The README and the docs/ pages say what is true.

- every setting is in docs/CONFIGURATION.md with its real default;
- docs/EXPORT.md's quality table gives each model's default step budget, and the README stays short;
- the README's commands are Makefile targets, and its one request per door (curl, the OpenAI client,
  tritonclient.http) works against a real server on the tiny models;
- every relative link in the README and docs/ reaches a file, and an anchor into a page a heading.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import LiveServer

from harness.ports import free_port
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "CONFIGURATION.md"
PAGES = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "loadtests" / "README.md",
]


def documented() -> dict[str, str]:
    """Variable -> its default cell, from the settings table (`A` / `B` rows give each its part)."""
    text = CONFIGURATION.read_text()
    table = text[text.index("| variable |") :]
    table = table[: table.index("\n\n")]
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
        assert variable in rows, f"{variable} is not in docs/CONFIGURATION.md's table"
        assert rows[variable] == shown(field.default), (variable, rows[variable], shown(field.default))


def test_quality_table_gives_the_default_step_budgets() -> None:
    """docs/EXPORT.md's quality table states each model's step budget as the default profile has it."""
    from model_export.profiles import MODEL_NAMES, recipe_for

    text = (ROOT / "docs" / "EXPORT.md").read_text()
    table = text[text.index("## Model quality") :]
    table = table[: table.index("\n## ", 5)]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in MODEL_NAMES:
            rows[cells[0]] = cells
    assert set(rows) == set(MODEL_NAMES)
    for name, cells in rows.items():
        budget = next(c for c in cells if re.match(r"^[\d,]+ steps", c))  # the "training budget" column
        steps = int(budget.replace(",", "").split()[0])
        assert steps == recipe_for("default", name).train.steps, (name, budget)


def test_the_readme_reads_in_five_minutes() -> None:
    """At most 1,000 words and no sentence over 40: every measured figure lives in docs/, linked."""
    text = README.read_text()
    assert len(text.split()) <= 1000, len(text.split())
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    prose = " ".join(line for line in prose.splitlines() if not line.startswith("|"))
    long = [s for s in re.split(r"(?<=[.!?])\s+", prose) if len(s.split()) > 40]
    assert not long, long
    assert "(docs/PERFORMANCE.md)" in text and "(docs/EXPORT.md#model-quality)" in text


def section(text: str, heading: str) -> str:
    """``text`` from ``heading`` to the next heading of the same or a higher level."""
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    following = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_commands_are_makefile_targets() -> None:
    quickstart = section(README.read_text(), "## Quickstart")
    commands = [
        line.split("#")[0].split() for block in code_blocks(quickstart, "bash") for line in block.splitlines()
    ]
    targets = [words[1] for words in commands if words[:1] == ["make"]]
    assert targets, "the Quickstart names no make target"
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"make {target}: no such Makefile target"


@pytest.fixture(scope="module")
def server(tiny_models: Path) -> Iterator[LiveServer]:
    grpc_port = free_port()
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, GRPC_PORT=grpc_port)) as live:
        live.grpc_address = f"127.0.0.1:{grpc_port}"  # type: ignore[attr-defined]
        yield live


def door_snippets() -> list[tuple[str, str]]:
    """(language, code) of the README's requests to a local server (HTTP on 8000, gRPC on 8001), one per door."""
    calling = section(README.read_text(), "## Calling the service")
    snippets = [(lang, code) for lang in ("bash", "python") for code in code_blocks(calling, lang)]
    return [(lang, code) for lang, code in snippets if "localhost:8000" in code or "localhost:8001" in code]


def test_readme_has_one_request_per_door() -> None:
    snippets = door_snippets()
    assert [lang for lang, _ in snippets].count("bash") >= 1  # REST with curl
    assert any("from openai import OpenAI" in code for _, code in snippets)
    assert any("tritonclient.http" in code for _, code in snippets)
    assert any("tritonclient.grpc" in code for _, code in snippets)


@pytest.mark.parametrize("index", range(len(door_snippets())))
def test_readme_request_works(server: LiveServer, index: int) -> None:
    language, code = door_snippets()[index]
    code = code.replace("localhost:8000", server.url.removeprefix("http://"))
    code = code.replace("localhost:8001", server.grpc_address)  # type: ignore[attr-defined]
    if language == "bash":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        command = ["bash", "-euo", "pipefail", "-c", code.replace("curl -s ", "curl -sS --fail-with-body ")]
    else:
        command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{code}\nprinted nothing"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name}: link to {target}: no such heading"
