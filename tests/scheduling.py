"""How the suite is spread over pytest-xdist's workers (`make test` runs ``-n N --dist loadscope``).

A unit of work is a test module, or a group of modules that must not run beside each other (``TOGETHER``),
so that a module's server fixtures start once. A module whose tests share no module-scoped fixture and
each take minutes (``ONE_BY_ONE``) is split: each of its tests is a unit, so that its long tests run side by
side instead of one after another at the end of the run.
The groups are named here by module path, not with ``xdist_group`` marks: the controller, which hands
the units out, sees node ids only, and pytest 9.2 no longer lets xdist write the group into them.
Units are handed out longest first (longest processing time first, the classic makespan heuristic), by
the seconds each took in a recorded run (``tests/durations.json``; ``--record-durations PATH`` writes a
new one at the end of a run). A unit the table does not know goes last, in collection order. The order is
read from a committed file, never from the machine, so every worker collects the same list.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
# Modules that must run on one worker, one after the other (none now). The image and compose tests once
# were: both build in the one private podman state. scripts/podman_build.sh now takes a lock for each
# build (and for the prune of what replaced builds left), so the second of them waits for the first's
# build and then reuses its layers, and only the compose test publishes fixed ports.
TOGETHER: dict[str, tuple[str, ...]] = {}
GROUP_OF = {module: group for group, modules in TOGETHER.items() for module in modules}
# Modules whose tests are units of their own: every fixture they use is per test or per session (the tiny
# models), and one unit of them ran alone on one core for the last 3 minutes of a 20-minute run.
ONE_BY_ONE = frozenset(
    {"tests/test_training.py", "tests/reliability/test_shutdown.py", "tests/test_benchmarks.py"}
)


def unit_of_nodeid(nodeid: str) -> str:
    """The unit a test is scheduled with: its module's group, else the test itself in a ``ONE_BY_ONE``
    module, else its module's path."""
    module = nodeid.split("::", 1)[0]
    if module in ONE_BY_ONE:
        return nodeid
    return GROUP_OF.get(module, module)


def order_longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: units by recorded seconds, longest first; inside a unit, as collected."""
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(unit_of_nodeid(item.nodeid), index)
    position = {id(item): index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, int, int]:
        unit = unit_of_nodeid(item.nodeid)
        return (-known.get(unit, 0.0), first_seen[unit], position[id(item)])

    items.sort(key=key)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadscope scheduler with a module or a group of modules, never a class, as the unit."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_nodeid(nodeid)

    return ModuleOrGroupScheduling(config, log)


class DurationRecorder:
    """Seconds per unit (set-up, call and teardown of every test in it), written at the end of the run,
    and beside them (``PATH`` with ``.timeline.json``) when each unit began and ended on which worker:
    what a run spent waiting on its last unit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)
        self.spans: dict[str, list[Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        unit = unit_of_nodeid(report.nodeid)
        self.seconds[unit] += report.duration
        worker = getattr(getattr(report, "node", None), "gateway", None)
        span = self.spans.setdefault(unit, [getattr(worker, "id", "main"), report.start, report.stop])
        span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)

    def pytest_sessionfinish(self) -> None:
        ranked = dict(sorted(self.seconds.items(), key=lambda kv: -kv[1]))
        self.path.write_text(json.dumps({k: round(v, 1) for k, v in ranked.items()}, indent=1) + "\n")
        begun = min((span[1] for span in self.spans.values()), default=0.0)
        timeline = sorted(
            (
                [unit, worker, round(start - begun, 1), round(stop - begun, 1)]
                for unit, (worker, start, stop) in self.spans.items()
            ),
            key=lambda row: row[2],
        )
        rows = ",\n".join(json.dumps(row) for row in timeline)
        self.path.with_suffix(".timeline.json").write_text(f"[\n{rows}\n]\n")
