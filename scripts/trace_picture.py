"""A picture of one batched request's trace, as a real server exported it: docs/trace-batched-request.png.

    .venv/bin/python scripts/trace_picture.py --models models

Starts ``python -m service`` on a free port over ``--models`` (only the text classifier, batches of up to 8
formed within 200 ms) exporting its traces over OTLP/gRPC to a receiver in this process
(``harness/otlp.py``), sends 8 classify requests at once, each with a ``traceparent`` of its own as a
gateway would, and draws what came back: the first request's trace as a waterfall (each span under its
parent, its duration to scale), and beneath it the batch span its ``queue`` span links to, with the
requests that batch served. Needs matplotlib (the ``load`` extra).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.otlp import OtlpReceiver, ReceivedSpan
from harness.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = 8


def classify(url: str, text: str, trace_id: str) -> int:
    request = urllib.request.Request(
        f"{url}/v1/classify",
        json.dumps({"text": text}).encode(),
        {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return int(answer.status)


def ordered(spans: list[ReceivedSpan]) -> list[tuple[int, ReceivedSpan]]:
    """(depth, span), each span under its parent, children by start time."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        parent = s.parent_span_id if s.parent_span_id in ids else ""
        children.setdefault(parent, []).append(s)
    out: list[tuple[int, ReceivedSpan]] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.span.start_time_unix_nano):
            out.append((depth, s))
            walk(s.span_id, depth + 1)

    walk("", 0)
    return out


def draw(trace: list[ReceivedSpan], batch: ReceivedSpan, served: int, out: Path) -> None:
    rows = ordered(trace)
    origin = min(s.span.start_time_unix_nano for s in [*trace, batch])
    end = (max(s.span.end_time_unix_nano for s in [*trace, batch]) - origin) / 1e6
    fig, ax = plt.subplots(figsize=(11, 0.45 * (len(rows) + 4) + 1))
    labels = []
    for y, (depth, s) in enumerate(rows):
        start = (s.span.start_time_unix_nano - origin) / 1e6
        ax.barh(y, max(s.seconds * 1e3, 0.02), left=start, color=f"C{min(depth, 9)}")
        ax.text(start + s.seconds * 1e3, y, f" {s.seconds * 1e3:.2f} ms", va="center", fontsize=8)
        labels.append("  " * depth + s.name)
    y = len(rows) + 1
    start = (batch.span.start_time_unix_nano - origin) / 1e6
    ax.barh(y, batch.seconds * 1e3, left=start, color="C3", hatch="//")
    a = batch.attributes
    ax.text(start + batch.seconds * 1e3, y, f" {batch.seconds * 1e3:.2f} ms", va="center", fontsize=8)
    ax.text(
        start,
        y + 0.65,
        f"{a['inference.model.name']} {a['inference.model.version'][:8]} ({a['inference.model.variant']}, "
        f"{a['inference.device']}): {a['inference.batch.size']} rows x {a['inference.batch.padded_length']} "
        f"tokens; links to the {served} requests it served",
        va="center",
        ha="right" if start > 0.5 * end else "left",
        fontsize=8,
    )
    labels += ["", "batch (its own trace, linked from queue)"]
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.set_ylim(len(labels) + 0.3, -0.7)
    ax.set_xlim(0, end * 1.15)
    ax.set_xlabel("milliseconds since the request's first span")
    ax.set_title(
        f"One of {REQUESTS} concurrent POST /v1/classify requests: its trace, and the batch it rode in"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "trace-batched-request.png")
    args = parser.parse_args()
    traces = [secrets.token_hex(16) for _ in range(REQUESTS)]
    with OtlpReceiver() as receiver:
        env = {
            "MODEL_REPOSITORY": str(args.models),
            "SERVED_MODELS": "bert-classifier",
            "CACHE_ENABLED": "false",
            "MAX_BATCH_SIZE": str(REQUESTS),
            "MAX_QUEUE_DELAY_MS": "200",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "transformer-serving",
        }
        with ServiceProcess(env, stop_grace_s=10) as service, ThreadPoolExecutor(REQUESTS) as pool:
            texts = [f"a film worth seeing, number {i}" for i in range(REQUESTS)]
            statuses = list(pool.map(lambda i: classify(service.url, texts[i], traces[i]), range(REQUESTS)))
            assert statuses == [200] * REQUESTS, statuses
            trace = receiver.wait_for(traces[0], "queue")
            time.sleep(0.5)  # the rest of the request's spans, exported in the same or the next batch
            trace = receiver.of_trace(traces[0])
        (queue,) = [s for s in trace if s.name == "queue"]
        ((batch_trace, batch_id),) = queue.links
        (batch,) = [s for s in receiver.named("batch") if s.span_id == batch_id and s.trace_id == batch_trace]
    draw(trace, batch, len(batch.links), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
