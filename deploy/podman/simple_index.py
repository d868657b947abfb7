"""Write a PEP 503 "simple" index (simple/<project>/index.html) over the wheels in a folder.

    python simple_index.py FOLDER

So that `pip install --index-url http://HOST/simple torch==X` finds wheels a machine already has (the
image build's TORCH_INDEX_URL, where the CPU wheel index cannot be reached). Standard library only.
"""

from __future__ import annotations

import html
import re
import sys
from collections import defaultdict
from pathlib import Path


def main(folder: Path) -> None:
    projects: dict[str, list[str]] = defaultdict(list)
    for wheel in sorted(folder.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects[name].append(wheel.name)
    for name, files in projects.items():
        page = folder / "simple" / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="../../{html.escape(f)}">{html.escape(f)}</a>\n' for f in files)
        page.write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    index = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(projects))
    (folder / "simple" / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{index}</body></html>\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
