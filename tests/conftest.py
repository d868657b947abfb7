"""Shared fixtures: the tiny model repository (real ONNX files, built in seconds) and a real Redis server.

The tiny models are built once by the real CLI (`python -m model_export all --profile tiny`) into
<cache>/test-models/<key>, outside the clone (harness/cache.py: ~/.cache/transformer-serving by default),
where the key hashes the export and task code: an unchanged tree reuses the last build, in this clone or
a fresh one, and any change to how models are built gives a fresh one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cache import cache_root
from harness.ports import free_port
from tests.scheduling import DurationRecorder, make_scheduler, order_longest_first

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def _source_key() -> str:
    digest = hashlib.sha256()
    for folder in ("model_export", "service/pipelines", "service/engine"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    from model_export.data import resolve_data_dir

    return resolve_data_dir()


@pytest.fixture(scope="session")
def tiny_models(data_dir: Path) -> Path:
    """A model repository with every model in the tiny profile; trained checkpoints under .work/.

    ``TEST_MODELS_DIR`` names one built elsewhere (the GPU run carries it: scripts/gpu/).
    """
    if os.environ.get("TEST_MODELS_DIR"):
        return Path(os.environ["TEST_MODELS_DIR"])
    out = cache_root() / "test-models" / _source_key()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Several test sessions may start at once (developers, helpers): one builds, the others wait for it.
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "evaluation.json").is_file():
            _build_tiny_models(out, data_dir)
            _keep_newest(out.parent, 8)
    return out


def _keep_newest(folder: Path, count: int) -> None:
    """Remove all but the ``count`` newest builds (13 MB each) from the shared cache folder."""
    builds = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in builds[:-count]:
        shutil.rmtree(old, ignore_errors=True)


def _build_tiny_models(out: Path, data_dir: Path) -> None:
    """The real CLI: `python -m model_export all --profile tiny` into ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "model_export", "all", "--profile", "tiny", "--out", str(out)]
    cmd += ["--data-dir", str(data_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"tiny model build failed:\n{proc.stderr[-4000:]}")


@pytest.fixture
def model_repo(tiny_models: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny repository that a test may damage."""
    repo = tmp_path / "models"
    shutil.copytree(tiny_models, repo, ignore=shutil.ignore_patterns(".work"))
    return repo


class RedisServer:
    """A real redis-server on a free loopback port, killable and restartable by tests."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run `make setup` (it installs it with apt)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """REDIS_URL when the environment gives one, else a private redis-server for this session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


# The fixtures that need the model build (or stand up servers on it): a test that uses none of them,
# directly or through another fixture, is in the fast layer (`make test-fast`), unless it is `slow`.
MODEL_FIXTURES = {"tiny_models", "model_repo", "imported_models"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & MODEL_FIXTURES:
            item.add_marker(pytest.mark.models)
    order_longest_first(items)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each scheduling unit's seconds to PATH at the end (tests/durations.json orders the units)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # xdist's loadscope scheduler re-sorts the units by their count of tests unless told not to, which
    # undid order_longest_first: a warm run started the fuzz test (9 minutes, 1 test) at 494 s, behind
    # modules of many short tests, and ended 170 s after the other workers.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller (or a serial run) sees every report
        config.pluginmanager.register(DurationRecorder(Path(path)), "duration-recorder")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return make_scheduler(config, log)
