"""Locust load test of the serving API: one user class per endpoint, inputs from the validation splits.

Run it through ``loadtests/run`` (starts the service and a private Redis, writes a report), or with
locust's own CLI against a running service::

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 8 -t 30s

Users (the short name is the key of ``LOCUST_WEIGHTS``; default weight in brackets):

- ``translate`` [2]          POST /v1/translate            Multi30k English sentences
- ``classify_text`` [3]      POST /v1/classify             SST-2 sentences
- ``classify_image`` [2]     POST /v1/classify (base64 PNG JSON) and POST /v1/classify/image (multipart),
                             Fashion-MNIST validation images
- ``generate`` [1]           POST /v1/generate             Tiny Shakespeare prompts, JSON answer
- ``generate_stream`` [1]    POST /v1/generate stream=true  the same prompts over SSE; reports time to
                             first token and time per output token (1000 / tokens/s) as custom "SSE" rows
- ``extract_qa`` [2]         POST /v1/extract task=qa      SQuAD question + context pairs
- ``extract_entities`` [2]   POST /v1/extract task=entities CoNLL-2003 sentences

Environment variables (all optional):

- ``LOAD_MIX``: ``cold`` (default: inputs drawn from the whole validation sets, ``Cache-Control:
  no-cache`` on every request, a fresh sampling seed per generation, so the response cache is never
  used) or ``warm`` (inputs from a small fixed pool with fixed seeds, no header, so repeats hit the cache).
- ``LOAD_POOL_SIZE``: inputs per endpoint in the warm pool (default 16).
- ``LOCUST_WEIGHTS``: e.g. ``translate=2,classify_text=4,generate_stream=0``; a weight of 0 removes the
  user class, classes not named keep their default. Locust's own class selection works too: name the
  classes on the command line (``locust -f ... TranslateUser GenerateStreamUser``) or use
  ``--class-picker`` in the web UI.
- ``LOAD_BATCH``: inputs per request for the batchable endpoints (default 1, at most 32 = MAX_ITEMS).
- ``LOAD_MAX_NEW_TOKENS``: generation length (default 32, at most 256 = MAX_NEW_TOKENS).
- ``LOAD_WAIT``: think time per user between requests, ``min,max`` seconds (default ``0.05,0.25``).
- ``DATA_DIR``: the data directory (default ``../shared/data`` next to the repository); built-in
  samples stand in for any dataset that is missing.
- ``LOAD_STATS_JSON``: where to write the mix, the input sources and per-endpoint cache-hit counts at
  the end (``loadtests/run`` sets it).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import requests
from locust import HttpUser, between, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadtest_data import png_base64, png_bytes
from loadtest_mix import (
    ALL_INPUTS,
    BATCH,
    HEADERS,
    INPUTS,
    MAX_NEW_TOKENS,
    MIX,
    POOL_SIZE,
    WAIT_MAX,
    WAIT_MIN,
    generation_prompts,
    pick,
    picks,
    seed_for,
)

log = logging.getLogger("loadtest")

STREAM_TIMEOUT = (10.0, 120.0)  # connect, read (between two events)

# name -> [responses, responses with cached: true]; merged from workers in distributed runs.
CACHE_COUNTS: dict[str, list[int]] = {}


class ServiceUser(HttpUser):
    """Shared plumbing: JSON POSTs checked for status, shape and the ``cached`` flag."""

    abstract = True
    host = "http://127.0.0.1:8000"
    wait_time = between(WAIT_MIN, WAIT_MAX)
    short_name: ClassVar[str] = ""

    def post_json(self, path: str, name: str, body: dict[str, Any], expect: int) -> None:
        self.check(
            self.client.post(path, json=body, headers=HEADERS, name=name, catch_response=True), name, expect
        )

    def check(self, response: Any, name: str, expect: int) -> None:
        with response as resp:
            if resp.status_code != 200:
                resp.failure(_error_text(resp))
                return
            try:
                payload = resp.json()
            except ValueError:
                resp.failure("200 with a body that is not JSON")
                return
            results = payload.get("results")
            if not isinstance(results, list) or len(results) != expect:
                resp.failure(
                    f"200 with {len(results) if isinstance(results, list) else 'no'} results, expected {expect}"
                )
                return
            counts = CACHE_COUNTS.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += bool(payload.get("cached"))


def _error_text(resp: Any) -> str:
    try:
        error = resp.json()["error"]
        return f"{resp.status_code} {error.get('type')}: {error.get('message')}"[:300]
    except (ValueError, KeyError, TypeError):
        return f"{resp.status_code}: {(resp.text or '')[:200]}"


class TranslateUser(ServiceUser):
    short_name = "translate"
    weight = 2

    @task
    def translate(self) -> None:
        texts = picks(INPUTS.translate)
        body: dict[str, Any] = {"text": texts[0]} if BATCH == 1 else {"texts": texts}
        self.post_json("/v1/translate", "/v1/translate", body, len(texts))


class ClassifyTextUser(ServiceUser):
    short_name = "classify_text"
    weight = 3

    @task
    def classify_text(self) -> None:
        texts = picks(INPUTS.sentiment)
        body: dict[str, Any] = {"text": texts[0]} if BATCH == 1 else {"texts": texts}
        body["top_k"] = 2
        self.post_json("/v1/classify", "/v1/classify [text]", body, len(texts))


class ClassifyImageUser(ServiceUser):
    short_name = "classify_image"
    weight = 2

    def _images(self, n: int) -> list[Any]:
        return [INPUTS.images[random.randrange(len(INPUTS.images))] for _ in range(n)]

    @task
    def classify_base64(self) -> None:
        images = [png_base64(image) for image in self._images(BATCH)]
        body: dict[str, Any] = {"image": images[0]} if BATCH == 1 else {"images": images}
        body["top_k"] = 3
        self.post_json("/v1/classify", "/v1/classify [image]", body, len(images))

    @task
    def classify_upload(self) -> None:
        (image,) = self._images(1)
        files = {"file": ("garment.png", png_bytes(image), "image/png")}
        name = "/v1/classify/image"
        response = self.client.post(
            "/v1/classify/image",
            files=files,
            data={"top_k": "3"},
            headers=HEADERS,
            name=name,
            catch_response=True,
        )
        self.check(response, name, 1)


def _generate_body(prompt_index: int, prompt: str) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_new_tokens": MAX_NEW_TOKENS,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": seed_for(prompt_index),
    }


class GenerateUser(ServiceUser):
    short_name = "generate"
    weight = 1

    @task
    def generate(self) -> None:
        if BATCH == 1:
            body = _generate_body(*pick(generation_prompts(self.host)))
        else:
            body = _generate_body(0, "")
            del body["prompt"]
            body["prompts"] = picks(generation_prompts(self.host))
        self.post_json("/v1/generate", "/v1/generate", body, len(body.get("prompts", [None])))


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) per Server-Sent Event from a line iterator (comments and ids ignored)."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                event = value
            elif key == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


class GenerateStreamUser(ServiceUser):
    """Streamed generation over SSE, timed by hand: locust's HTTP timing stops at the response headers.

    Three "SSE" rows, all in milliseconds (so locust's aggregate stays a latency):
    ``/v1/generate [stream]`` (the whole stream; response length = tokens received),
    ``generate-stream ttft`` (time to first token: from sending the request to the first token event) and
    ``generate-stream ms/token`` (time per output token after the first: (t_last - t_first) / (tokens - 1);
    decode tokens/s = 1000 / this, which the run's summary shows).
    """

    short_name = "generate_stream"
    weight = 1

    def on_start(self) -> None:
        self.sse = requests.Session()

    def on_stop(self) -> None:
        self.sse.close()

    def fire(self, name: str, value: float, length: int = 0, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type="SSE",
            name=name,
            response_time=value,
            response_length=length,
            exception=exception,
            context={},
        )

    @task
    def generate_stream(self) -> None:
        body = _generate_body(*pick(generation_prompts(self.host))) | {"stream": True}
        name = "/v1/generate [stream]"
        start = time.perf_counter()
        first = last = None
        tokens = 0
        try:
            with self.sse.post(
                f"{self.host}/v1/generate",
                json=body,
                headers={**HEADERS, "Accept": "text/event-stream"},
                stream=True,
                timeout=STREAM_TIMEOUT,
            ) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(_error_text(resp))
                done = None
                for event, data in sse_events(resp.iter_lines(decode_unicode=True)):
                    if event == "token":
                        last = time.perf_counter()
                        first = first or last
                        tokens += 1
                    elif event == "done":
                        done = json.loads(data)
                        break
                    elif event == "error":
                        raise RuntimeError(f"error event: {data[:200]}")
                if done is None:
                    raise RuntimeError(f"stream ended without a done event after {tokens} tokens")
                if done["usage"]["output_tokens"] != tokens:
                    raise RuntimeError(
                        f"{tokens} token events but usage says {done['usage']['output_tokens']}"
                    )
        except Exception as exc:  # every failure is reported, none ends the user
            self.fire(name, (time.perf_counter() - start) * 1000, tokens, exc)
            return
        end = time.perf_counter()
        self.fire(name, (end - start) * 1000, tokens)
        if first is not None:
            self.fire("generate-stream ttft", (first - start) * 1000)
        if first is not None and last is not None and tokens >= 2:
            self.fire("generate-stream ms/token", (last - first) * 1000 / (tokens - 1), tokens)


class ExtractQAUser(ServiceUser):
    short_name = "extract_qa"
    weight = 2

    @task
    def extract_qa(self) -> None:
        pairs = picks(INPUTS.qa)
        if BATCH == 1:
            body: dict[str, Any] = {"task": "qa", "question": pairs[0][0], "context": pairs[0][1]}
        else:
            body = {"task": "qa", "items": [{"question": q, "context": c} for q, c in pairs]}
        self.post_json("/v1/extract", "/v1/extract [qa]", body, len(pairs))


class ExtractEntitiesUser(ServiceUser):
    short_name = "extract_entities"
    weight = 2

    @task
    def extract_entities(self) -> None:
        texts = picks(INPUTS.entities)
        body: dict[str, Any] = {"task": "entities"}
        body |= {"text": texts[0]} if BATCH == 1 else {"texts": texts}
        self.post_json("/v1/extract", "/v1/extract [entities]", body, len(texts))


USER_CLASSES: dict[str, type[ServiceUser]] = {
    cls.short_name: cls
    for cls in (
        TranslateUser,
        ClassifyTextUser,
        ClassifyImageUser,
        GenerateUser,
        GenerateStreamUser,
        ExtractQAUser,
        ExtractEntitiesUser,
    )
}


def parse_weights(spec: str) -> dict[str, int]:
    """``"translate=2, generate=0"`` -> {"translate": 2, "generate": 0}; unknown names are an error."""
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or key not in USER_CLASSES:
            raise ValueError(
                f"LOCUST_WEIGHTS: {part!r}: expected NAME=WEIGHT with NAME one of {sorted(USER_CLASSES)}"
            )
        weights[key] = int(value)
        if weights[key] < 0:
            raise ValueError(f"LOCUST_WEIGHTS: {part!r}: a weight must be >= 0")
    return weights


for _name, _weight in parse_weights(os.environ.get("LOCUST_WEIGHTS", "")).items():
    USER_CLASSES[_name].weight = _weight
    USER_CLASSES[_name].abstract = _weight == 0  # locust ignores abstract classes: weight 0 removes it


# ---------------------------------------------------------------------------------------------------------
# Cache-hit counts: summed over workers, written at the end.


@events.report_to_master.add_listener
def _send_counts(client_id: str, data: dict[str, Any]) -> None:
    data["cache_counts"] = {name: list(c) for name, c in CACHE_COUNTS.items()}
    CACHE_COUNTS.clear()


@events.worker_report.add_listener
def _merge_counts(client_id: str, data: dict[str, Any]) -> None:
    for name, (n, hits) in data.get("cache_counts", {}).items():
        counts = CACHE_COUNTS.setdefault(name, [0, 0])
        counts[0] += n
        counts[1] += hits


def _active_weights(environment: Environment) -> dict[str, int]:
    """Weights of the user classes this run uses (LOCUST_WEIGHTS, and any classes named to locust)."""
    chosen = environment.user_classes or [cls for cls in USER_CLASSES.values() if not cls.abstract]
    return {getattr(cls, "short_name", cls.__name__): cls.weight for cls in chosen}


@events.init.add_listener
def _announce(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    active = _active_weights(environment)
    log.info(
        "load mix %s (pool %s), weights %s, inputs %s from %s",
        MIX,
        POOL_SIZE if MIX == "warm" else "-",
        active,
        INPUTS.counts(),
        ALL_INPUTS.data_dir or "built-in samples",
    )


@events.quitting.add_listener
def _write_stats(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    summary = {
        "mix": MIX,
        "pool_size": POOL_SIZE if MIX == "warm" else None,
        "batch": BATCH,
        "max_new_tokens": MAX_NEW_TOKENS,
        "weights": _active_weights(environment),
        "data_dir": str(ALL_INPUTS.data_dir) if ALL_INPUTS.data_dir else None,
        "sources": ALL_INPUTS.sources,
        "inputs": INPUTS.counts(),
        "distributed": isinstance(environment.runner, MasterRunner),
        "cache": {name: {"responses": n, "cached": hits} for name, (n, hits) in sorted(CACHE_COUNTS.items())},
    }
    for name, c in summary["cache"].items():
        log.info("cache: %s %d/%d responses cached", name, c["cached"], c["responses"])
    path = os.environ.get("LOAD_STATS_JSON")
    if path:
        Path(path).write_text(json.dumps(summary, indent=2) + "\n")
