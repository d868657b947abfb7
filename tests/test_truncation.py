"""Truncation the caller chooses on the REST door's encoder tasks (embed, classify, entities): by default a
text over the window is cut at its end and flagged; ``truncate: false`` refuses it (422 naming the text);
``truncation_direction: left`` keeps its end. The same choice on TEI's routes gives the same numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from servers import LiveServer

from service.settings import Settings

# Over every tiny encoder's window (48-64 tokens); its two ends say different things.
LONG = "Ada Lovelace lived in London. " + "The weather report said rain again tomorrow, " * 10 + "in Paris."


@pytest.fixture(scope="module")
def http(tiny_models: Path) -> Iterator[httpx.Client]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, MAX_QUEUE_DELAY_MS=20, CACHE_ENABLED=False)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def ok(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    answer = http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_embed_cuts_either_end_or_refuses(http: httpx.Client) -> None:
    default = ok(http, "/v1/embed", {"texts": ["short", LONG]})["results"]
    assert [r["truncated"] for r in default] == [False, True]
    right = ok(http, "/v1/embed", {"text": LONG, "truncate": True, "truncation_direction": "right"})[
        "results"
    ][0]
    left = ok(http, "/v1/embed", {"text": LONG, "truncation_direction": "left"})["results"][0]
    assert right["embedding"] == pytest.approx(default[1]["embedding"], abs=1e-6)
    assert left["truncated"] and float(np.dot(left["embedding"], right["embedding"])) < 0.9999
    tei_left = ok(http, "/embed", {"inputs": LONG, "truncation_direction": "left"})[0]
    assert tei_left == pytest.approx(left["embedding"], abs=1e-5)  # the same choice on TEI's door

    refused = http.post("/v1/embed", json={"texts": ["short", LONG], "truncate": False})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == "texts[1]" and error["errors"][0]["type"] == "too_many_tokens"
    short = ok(http, "/v1/embed", {"text": "short", "truncate": False})["results"][0]
    assert not short["truncated"]


def test_classify_and_entities_take_the_choice(http: httpx.Client) -> None:
    left = ok(http, "/v1/classify", {"text": LONG, "top_k": 2, "truncation_direction": "left"})["results"][0]
    assert left["truncated"]
    tei = ok(http, "/predict", {"inputs": LONG, "truncation_direction": "left"})
    assert [p["score"] for p in tei] == pytest.approx([s["score"] for s in left["labels"]], abs=1e-6)
    refused = http.post("/v1/classify", json={"text": LONG, "truncate": False})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "text"

    for direction in ("left", "right"):
        body = {"task": "entities", "text": LONG, "truncation_direction": direction}
        tagged = ok(http, "/v1/extract", body)["results"][0]
        assert tagged["truncated"]
        for e in tagged["entities"]:  # offsets still index the text the client sent
            assert LONG[e["start"] : e["end"]] == e["text"]
            if direction == "left":
                assert e["start"] > len("Ada Lovelace lived in London. ")  # its start was cut
    refused = http.post("/v1/extract", json={"task": "entities", "texts": ["a", LONG], "truncate": False})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "texts[1]"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/extract", {"task": "qa", "question": "q?", "context": "c", "truncate": False}, "truncate"),
        ("/v1/classify", {"image": "aGVsbG8=", "truncation_direction": "left"}, "truncation_direction"),
        ("/v1/embed", {"text": "a", "truncation_direction": "middle"}, "truncation_direction"),
    ],
)
def test_truncation_fields_where_they_do_not_apply(
    http: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    answer = http.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == field


def v2(http: httpx.Client, model: str, texts: list[str], **parameters: Any) -> httpx.Response:
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    return http.post(f"/v2/models/{model}/infer", json={**body, "parameters": parameters})


def test_the_tensor_door_takes_the_same_choices(http: httpx.Client) -> None:
    left = ok(http, "/v1/embed", {"text": LONG, "truncation_direction": "left"})["results"][0]["embedding"]
    answer = v2(http, "bert-embedder", [LONG], truncation_direction="left")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == pytest.approx(left, abs=1e-5)
    refused = v2(http, "bert-classifier", ["short", LONG], truncate=False)
    assert refused.status_code == 400 and refused.json()["error"].startswith("text[1]:"), refused.text
    bad = v2(http, "bert-embedder", ["a"], truncation_direction="middle")
    assert bad.status_code == 400 and bad.json()["error"].startswith("parameters.truncation_direction:")

    tokens = ok(
        http,
        "/v1/extract",
        {"task": "entities", "text": LONG, "aggregation_strategy": "none", "ignore_labels": []},
    )
    tagged = v2(http, "bert-tagger", [LONG], aggregation_strategy="none", ignore_labels=[])
    assert tagged.status_code == 200, tagged.text
    assert json.loads(tagged.json()["outputs"][0]["data"][0]) == tokens["results"][0]["entities"]
    unknown = v2(http, "bert-tagger", ["a"], aggregation_strategy="mean")
    assert unknown.status_code == 400 and unknown.json()["error"].startswith(
        "parameters.aggregation_strategy:"
    )
