"""GET /metrics: drive real traffic through a live server, scrape, and check each figure moved as it should.

Every check is a difference between two scrapes, so warm-up traffic and other
tests never matter. The exposition must also pass ``promtool check metrics``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import LiveServer, small_queues

from service.settings import Settings

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client) -> Samples:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@pytest.fixture(scope="module")
def server(tiny_models: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=True, REDIS_URL=None)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_traffic_moves_the_metrics(client: httpx.Client) -> None:
    before = scrape(client)
    classify = "/v1/classify"
    for text in ("a fine film", "a dull film", "a fine film"):  # the third is a cache hit
        assert client.post(classify, json={"text": text}).status_code == 200
    assert client.post(classify, json={"text": ""}).status_code == 422
    assert client.post(classify, json={"text": "x", "model": "nope"}).status_code == 404
    generated = client.post("/v1/generate", json={"prompt": "KING:", "max_new_tokens": 6, "temperature": 0})
    completion = generated.json()["results"][0]["completion_tokens"]
    with client.stream(
        "POST",
        "/v1/generate",
        json={"prompt": "QUEEN:", "max_new_tokens": 5, "temperature": 0, "stream": True},
    ) as r:
        streamed = r.read().decode().count("event: token")
    # The stream's request is counted once the server has sent its last byte, which can be a moment
    # after the client read it: wait for the in-flight gauge to come back to zero.
    deadline = time.monotonic() + 10
    while value(after := scrape(client), "tserve_http_requests_in_flight", route="/v1/generate"):
        assert time.monotonic() < deadline, "the stream's request never finished"
        time.sleep(0.02)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ok = {"route": classify, "method": "POST", "model": "bert-classifier", "status": "200"}
    assert delta("tserve_http_requests_total", **ok) == 3
    assert delta("tserve_http_request_duration_seconds_count", **ok) == 3
    assert delta("tserve_http_requests_total", route=classify, status="422", model="") == 1
    # An unknown model name never becomes a label value.
    assert delta("tserve_http_requests_total", route=classify, status="404", model="") == 1
    assert not any(("model", "nope") in labels for _, labels in after)
    assert delta("tserve_http_requests_total", route="/v1/generate", model="gpt", status="200") == 2

    # Two of the three classifications reached the model, one item each; the third was a hit.
    assert delta("tserve_cache_misses_total", model="bert-classifier") == 2
    assert delta("tserve_cache_hits_total", model="bert-classifier") == 1
    assert delta("tserve_batch_size_count", model="bert-classifier") == 2
    assert delta("tserve_batch_size_sum", model="bert-classifier") == 2
    assert delta("tserve_queue_duration_seconds_count", model="bert-classifier") == 2
    assert delta("tserve_compute_duration_seconds_count", model="bert-classifier") == 2
    assert delta("tserve_batch_tokens_sum", model="bert-classifier") > 0

    # Generation: every token counted, one first token per sequence, the gaps between the others.
    assert delta("tserve_generated_tokens_total", model="gpt") == completion + streamed
    assert delta("tserve_time_to_first_token_seconds_count", model="gpt") == 2
    assert delta("tserve_time_per_output_token_seconds_count", model="gpt") == completion + streamed - 2
    assert delta("tserve_generations_total", model="gpt") == 2

    # Gauges are back at rest; only this scrape is in flight.
    assert value(after, "tserve_queue_depth", model="bert-classifier") == 0
    assert value(after, "tserve_model_in_flight", model="gpt") == 0
    assert value(after, "tserve_http_requests_in_flight", route="/v1/classify") == 0
    assert value(after, "tserve_http_requests_in_flight", route="/metrics") == 1


def test_model_info_matches_the_models_endpoint(client: httpx.Client) -> None:
    samples = scrape(client)
    for model in client.get("/v1/models").json()["data"]:
        labels = {
            "model": model["name"],
            "version": model["version"],
            "task": model["task"],
            "execution_provider": model["execution_provider"],
            "variant": model["variant"],
            "precision": model["precision"],
        }
        assert value(samples, "tserve_model_info", **labels) == 1, labels


def test_rejections_are_counted_and_never_taken_for_drops(tiny_models: Path) -> None:
    """Small queues under a burst: every 429 is a queue_full rejection of its model, and a request whose
    prompts do not all fit is refused whole (none of its prompts queued, so nothing is counted as
    dropped by a departed client)."""
    settings = small_queues(tiny_models, MAX_QUEUE_SIZE=4, MAX_ITEMS=3, MAX_RUNNING_SEQUENCES=1)
    translate = {"text": "A woman in a red dress sings on a stage.", "beam_size": 4, "max_new_tokens": 40}
    generate = {"prompts": ["KING:", "QUEEN:", "DUKE:"], "max_new_tokens": 30, "temperature": 0}
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as c:
        with ThreadPoolExecutor(20) as pool:
            translated = list(
                pool.map(lambda _: c.post("/v1/translate", json=translate).status_code, range(40))
            )
            generated = list(pool.map(lambda _: c.post("/v1/generate", json=generate).status_code, range(20)))
        samples = scrape(c)
    assert set(translated) <= {200, 429} and set(generated) <= {200, 429}
    for model, statuses in (("translator", translated), ("gpt", generated)):
        refused = statuses.count(429)
        assert refused > 0, model
        assert value(samples, "tserve_requests_rejected_total", model=model, reason="queue_full") == refused
        assert value(samples, "tserve_http_requests_total", model=model, status="429") == refused
        assert value(samples, "tserve_requests_dropped_total", model=model) == 0


def test_exposition_passes_promtool(client: httpx.Client) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make setup` (it installs Debian's prometheus package)"
    client.post("/v1/classify", json={"text": "so that histograms have samples"})
    text = client.get("/metrics").text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
