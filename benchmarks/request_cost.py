"""(l) The most one request may cost at the default limits: its latency on an idle server, one at a time.

The limits that bound a single request's compute (docs/CONFIGURATION.md, "Cost per request") are
only worth their defaults if the largest request they admit stays well under a second on the
default models. Each case is the largest request the defaults admit, or close to it:

- QA: pairs whose windows hold about MAX_CONTEXT_TOKENS tokens together (long SQuAD-like contexts);
- images: MAX_REQUEST_PIXELS in one image (a PNG of blocks, a few kilobytes, that decodes to all its
  pixels), and in 32 images of 512 x 512.

Each is sent alone to an idle ``python -m service`` (the response cache bypassed), a few times; the
figure is the median latency, with the request's ``usage.input_tokens``.

    python benchmarks/request_cost.py --models models
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/request_cost.py` anywhere

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server
from harness.stats import median
from service.settings import Settings

NAME = "request_cost"
TITLE = "(l) The costliest request the default limits admit: latency alone on an idle server"
TARGET_S = 1.0
DEFAULTS = Settings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=None, help="times each request is sent (default 5)")


def flat_png(width: int, height: int) -> bytes:
    """A PNG of a few kilobytes that still decodes to width x height pixels: decoding costs by the pixel,
    so this is the costliest image MAX_IMAGE_BYTES lets through."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x // 64) % 256, (y // 64) % 256, ((x + y) // 128) % 256], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", optimize=True)
    return out.getvalue()


def qa_items(tokens: int) -> list[dict[str, str]]:
    """More QA pairs than ``tokens`` admits (run() drops pairs until the request fits): contexts of 1,000
    characters, so that the largest request admitted comes within a pair of MAX_CONTEXT_TOKENS."""
    sentence = "The committee met in Geneva in 1923 to discuss the treaty, and its members disagreed. "
    context = (sentence * (1000 // len(sentence) + 1))[:1000]
    return [{"question": "Where did the committee meet?", "context": context} for _ in range(tokens // 100)]


def _timed(server: Any, path: str, body: dict[str, Any], repeats: int) -> tuple[float, int, int]:
    import httpx

    latencies, tokens, status = [], 0, 0
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.post(path, json=body, headers={"Cache-Control": "no-cache, no-store"})
            latencies.append(time.perf_counter() - started)
            status = response.status_code
            if response.is_success:
                tokens = int(response.json()["usage"]["input_tokens"])
    return median(latencies), tokens, status


def run(opts: Options) -> Result:
    repeats = opts.extra.get("repeats") or (1 if opts.quick else 5)
    qa, vit = find_model(opts.models, "question-answering"), find_model(opts.models, "image-classification")
    big = base64.b64encode(flat_png(2896, 2896)).decode()
    small = base64.b64encode(flat_png(512, 512)).decode()
    cases: list[tuple[str, str, dict[str, Any]]] = []
    items = qa_items(DEFAULTS.max_context_tokens)
    long_pair = {**items[0], "context": (items[0]["context"] * 8)[: DEFAULTS.max_context_chars]}
    rows, checks = [], []
    with subset_repository([qa, vit]) as repository, benchmark_server(repository, opts) as server:
        # shrink the QA request until it fits MAX_CONTEXT_TOKENS: the largest that the default admits
        while len(items) > 1:
            _, _, status = _timed(server, "/v1/extract", {"task": "qa", "items": items}, 1)
            if status == 200:
                break
            items = items[:-1]
        cases = [
            (f"QA: {len(items)} pairs of 1,000 characters", "/v1/extract", {"task": "qa", "items": items}),
            ("QA: one pair of MAX_CONTEXT_CHARS", "/v1/extract", {"task": "qa", "items": [long_pair]}),
            ("images: one 2896 x 2896 PNG (MAX_REQUEST_PIXELS)", "/v1/classify", {"images": [big]}),
            ("images: 32 PNGs of 512 x 512", "/v1/classify", {"images": [small] * 32}),
        ]
        for label, path, body in cases:
            seconds, tokens, status = _timed(server, path, body, repeats)
            rows.append(f"| {label} | {status} | {tokens} | {seconds * 1000:.0f} |")
            checks.append(Check(f"{label}: seconds", seconds, TARGET_S, higher_is_better=False, unit=" s"))
    details = [
        "| request | status | usage.input_tokens | median latency (ms) |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Defaults: MAX_CONTEXT_TOKENS {DEFAULTS.max_context_tokens}, MAX_REQUEST_PIXELS {DEFAULTS.max_request_pixels}, "
        f"MAX_IMAGE_BYTES {DEFAULTS.max_image_bytes} (the 2896 x 2896 PNG is {len(base64.b64decode(big)) / 1e6:.2f} MB). "
        f"Each request alone, {repeats} time(s), on an idle server; the response cache bypassed.",
    ]
    return Result(NAME, TITLE, {"request_cost_s": {c.label: c.value for c in checks}}, checks, details)


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
