"""How much of ``service/`` one request runs: the distinct files and functions, counted with a tracer.

A request's path is what a maintainer has to read to follow it, and each layer it crosses costs CPU. Here
the app runs in this process (uvicorn on a loopback port, the response cache off), with a profile hook
set on every thread before the app starts (``threading.setprofile`` and ``sys.setprofile``), so that the
event loop, the compute threads and the executor's threads are all counted. Each request is sent once to
warm up (first-call imports, compiled caches), then the counts are reset and it is sent again: the
figures are that second request's distinct ``service/`` files and (file, function) pairs.

    python benchmarks/files_per_request.py --models ~/.cache/transformer-serving/test-models/<key>

Issue 61 set the target for a REST classify at 25 files (40 at a4ed82b, 178 functions); it reports the
translate and the generate too.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/files_per_request.py`

from benchmarks.cli import main
from benchmarks.options import ROOT, Options
from benchmarks.results import Check, Result

NAME = "files_per_request"
TITLE = "(t) The service/ files and functions one request runs (a tracer on every thread)"
TARGET_FILES = 25  # a REST classify (issue 61)
SERVICE = str(ROOT / "service") + "/"

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("REST classify, 1 text", "/v1/classify", {"text": "a fine, warm film"}),
    ("REST translate, 1 text", "/v1/translate", {"text": "A man is riding a bicycle."}),
    ("REST generate, 8 tokens", "/v1/generate", {"prompt": "KING:", "max_new_tokens": 8, "temperature": 0}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass  # the common options only


class Tracer:
    """The (file, function) pairs of ``service/`` called on any thread since the last ``reset``."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(SERVICE):
                key = (code.co_filename, code.co_name)
                if key not in self.seen:
                    with self._lock:
                        self.seen.add(key)

    def reset(self) -> None:
        with self._lock:
            self.seen = set()

    def files(self) -> set[str]:
        return {file for file, _ in self.seen}


def _serve(models: Path, threads: int) -> tuple[Any, threading.Thread, str]:
    import uvicorn

    from service.app import create_app
    from service.http_server import uvicorn_config
    from service.settings import Settings

    settings = Settings(
        model_repository=models, cache_enabled=False, access_log=False, intra_op_threads=threads
    )
    app = create_app(settings)
    config = uvicorn_config(app, settings, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="files-per-request-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


def run(opts: Options) -> Result:
    import httpx

    tracer = Tracer()
    threading.setprofile(tracer)  # every thread started from now: the loop's, the compute threads
    sys.setprofile(tracer)
    server, thread, url = _serve(opts.models, opts.threads)
    rows, metrics, checks = [], {}, []
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for label, path, body in CASES:
                assert client.post(path, json=body).status_code == 200, f"{label}: the warm-up failed"
                time.sleep(0.2)  # what the warm-up left running (its access log, metrics) ends
                tracer.reset()
                response = client.post(path, json=body)
                time.sleep(0.2)  # the request's own after-work (its background tasks) is counted too
                files, functions = sorted(tracer.files()), len(tracer.seen)
                assert response.status_code == 200, response.text
                rows.append(f"| {label} | {len(files)} | {functions} |")
                metrics[label] = {"files": len(files), "functions": functions}
                if path == "/v1/classify":
                    checks.append(Check(f"{label}: service/ files", len(files), TARGET_FILES, False, ""))
                    listing = ", ".join(f.removeprefix(SERVICE) for f in files)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        server.should_exit = True
        thread.join(timeout=60)
    details = [
        "| request | distinct service/ files | distinct functions |",
        "|---|---|---|",
        *rows,
        "",
        f"The classify's files: {listing}.",
        "",
        "One process (FRONTENDS=0), the response cache off; each request sent once to warm up, then counted.",
    ]
    return Result(NAME, TITLE, {"files_per_request": metrics}, checks, details)


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
