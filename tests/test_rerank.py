"""Rerank and score scored by the served embedder's cosine (no reranker in the repository), as vLLM does:
Cohere's ``/v1/rerank`` and ``/v2/rerank`` driven by the real ``cohere`` client, Jina's shape, vLLM's
``/v1/score`` one-to-many and paired. Every number is compared with the cosine of the REST door's
``/v1/embed`` vectors for the same texts. One live server, behind an API key, for the whole module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from servers import LiveServer, metric

from service.settings import Settings

KEY = "rerank-key"
QUERY = "Which instrument is the man playing?"
DOCUMENTS = [
    "The central bank raised interest rates again this quarter.",
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar on a porch at dusk.",
    "ok",
]


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS="bert-embedder,bert-classifier",  # no reranker served: the embedder scores
        MAX_ITEMS=8,
        MAX_QUEUE_DELAY_MS=20,
        API_KEYS=[KEY],
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def http(api: LiveServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=api.url, timeout=120, headers=headers) as c:
        yield c


def cosines(http: httpx.Client, query: str, documents: list[str]) -> np.ndarray:
    """The REST embed door's unit vectors for the query and each document, and their dot products."""
    answer = http.post("/v1/embed", json={"texts": [query, *documents], "cache": False})
    assert answer.status_code == 200, answer.text
    vectors = np.array([r["embedding"] for r in answer.json()["results"]], dtype=np.float64)
    return vectors[1:] @ vectors[0]


def test_cohere_v1_client_ranks_by_the_embedders_cosine(api: LiveServer, http: httpx.Client) -> None:
    expected = cosines(http, QUERY, DOCUMENTS)
    client = cohere.Client(api_key=KEY, base_url=api.url)
    answer = client.rerank(query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True)
    assert [r.index for r in answer.results] == list(np.argsort(-expected)[:3])
    for r in answer.results:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-5)
        assert r.document is not None and r.document.text == DOCUMENTS[r.index]
    raw = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert raw["model"] == "bert-embedder" and raw["scored_by"] == "cosine"
    assert raw["usage"]["total_tokens"] > len(DOCUMENTS)


def test_cohere_v2_client_ranks_every_document(api: LiveServer, http: httpx.Client) -> None:
    expected = cosines(http, QUERY, DOCUMENTS)
    client = cohere.ClientV2(api_key=KEY, base_url=api.url)
    answer = client.rerank(model="bert-embedder", query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in answer.results] == list(np.argsort(-expected))
    assert [r.relevance_score for r in answer.results] == pytest.approx(
        sorted(expected, reverse=True), abs=1e-5
    )


def test_jina_shape_takes_document_objects(http: httpx.Client) -> None:
    expected = cosines(http, QUERY, DOCUMENTS)
    body = {
        "model": "bert-embedder",
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 10,  # more than there are: every document
        "return_documents": False,
    }
    answer = http.post("/v1/rerank", json=body)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == len(DOCUMENTS) and all(r["document"] is None for r in results)
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5)


def test_vllm_score_one_to_many_and_paired(http: httpx.Client) -> None:
    expected = cosines(http, QUERY, DOCUMENTS)
    one = http.post("/v1/score", json={"model": "bert-embedder", "text_1": QUERY, "text_2": DOCUMENTS})
    assert one.status_code == 200, one.text
    data = one.json()["data"]
    assert [d["index"] for d in data] == list(range(len(DOCUMENTS)))
    assert [d["score"] for d in data] == pytest.approx(list(expected), abs=1e-5)
    assert one.json()["scored_by"] == "cosine" and one.json()["object"] == "list"

    queries = [QUERY, "What did the central bank do?"]
    paired = http.post("/v1/score", json={"queries": queries, "documents": DOCUMENTS[1::-1]})
    assert paired.status_code == 200, paired.text
    scores = [d["score"] for d in paired.json()["data"]]
    assert scores == pytest.approx(
        [cosines(http, q, [d])[0] for q, d in zip(queries, DOCUMENTS[1::-1], strict=True)], abs=1e-5
    )
    single = http.post("/v1/score", json={"text_1": [QUERY], "text_2": DOCUMENTS[1]}).json()
    assert single["data"][0]["score"] == pytest.approx(expected[1], abs=1e-5)


def test_rerank_is_cached_metered_and_behind_the_key(api: LiveServer, http: httpx.Client) -> None:
    body = {"query": "a cached query", "documents": DOCUMENTS}
    hits = metric(api.url, "tserve_cache_hits_total", model="bert-embedder")
    first = http.post("/v2/rerank", json=body).json()
    second = http.post("/v2/rerank", json=body).json()
    assert second["results"] == first["results"]
    assert metric(api.url, "tserve_cache_hits_total", model="bert-embedder") == hits + 1
    ok = {"route": "/v2/rerank", "method": "POST", "model": "bert-embedder", "status": "200"}
    assert metric(api.url, "tserve_http_requests_total", **ok) >= 2
    refused = httpx.post(f"{api.url}/v1/score", json={"text_1": "a", "text_2": "b"})
    assert refused.status_code == 401 and "error" in refused.json()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": ["d"] * 9}, "documents"),  # MAX_ITEMS is 8
        ("/v1/rerank", {"query": " ", "documents": DOCUMENTS}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
        ("/v2/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents[1]"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "rank_fields": ["title"]}, "rank_fields"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "model": "bert-classifier"}, "model"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ("/v1/score", {"queries": ["a", "b"], "documents": "c"}, "documents"),
        ("/v1/score", {"text_1": "a"}, "text_2"),
        ("/v1/score", {"text_1": "a", "queries": "b", "text_2": "c"}, "text_1"),
        ("/v1/score", {"text_1": [], "text_2": "c"}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": ["d"] * 9}, "text_2"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    answer = http.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field, answer.text


LONG = "Guitars were first made in Spain. " + "The weather report said rain again tomorrow. " * 12


def test_tei_rerank_answers_teis_list(http: httpx.Client) -> None:
    expected = cosines(http, QUERY, DOCUMENTS)
    answer = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-scored-by"] == "cosine" and answer.headers["x-model"] == "bert-embedder"
    ranks = answer.json()
    assert [r["index"] for r in ranks] == list(np.argsort(-expected))
    for r in ranks:
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-5)
        assert r["text"] == DOCUMENTS[r["index"]]
    raw = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    assert all("text" not in r for r in raw)
    assert [r["score"] for r in raw] == pytest.approx([r["score"] for r in ranks], abs=1e-6)


def test_tei_rerank_truncation_the_caller_chooses(http: httpx.Client) -> None:
    body = {"query": "Where were guitars first made?", "texts": ["Spain.", LONG]}
    refused = http.post("/rerank", json={**body, "truncate": False})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error_type"] == "Validation"
    assert refused.json()["error"].startswith("texts[1]:") and "truncate" in refused.json()["error"]

    def score(**options: Any) -> float:
        ranks = http.post("/rerank", json={**body, **options}).json()
        return float(next(r["score"] for r in ranks if r["index"] == 1))

    default = score()
    assert score(truncate=True) == pytest.approx(default, abs=1e-6)
    assert score(truncation_direction="Right") == pytest.approx(default, abs=1e-6)
    assert score(truncation_direction="left") != pytest.approx(default, abs=1e-4)  # the other end kept
    short = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "truncate": False})
    assert short.status_code == 200  # nothing over the window: nothing to refuse


@pytest.mark.parametrize(
    ("body", "status", "error_type", "field"),
    [
        ({"query": QUERY, "texts": []}, 400, "Empty", "texts"),
        ({"query": "", "texts": ["a"]}, 422, "Validation", "query"),
        ({"query": QUERY, "texts": ["a", " "]}, 422, "Validation", "texts[1]"),
        ({"query": QUERY, "texts": ["a"] * 9}, 422, "Validation", "texts"),
        (
            {"query": QUERY, "texts": ["a"], "truncation_direction": "middle"},
            422,
            "Validation",
            "truncation_direction",
        ),
    ],
)
def test_tei_rerank_bad_input(
    http: httpx.Client, body: dict[str, Any], status: int, error_type: str, field: str
) -> None:
    answer = http.post("/rerank", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error_type"] == error_type
    assert answer.json()["error"].startswith(f"{field}:"), answer.text


def test_rerank_is_charged_to_the_key_and_held_to_its_models(tiny_models: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(
        "[[keys]]\nid = 'tokens'\n"
        f"sha256 = '{hashlib.sha256(b'tokens-key').hexdigest()}'\ntokens_per_minute = 60\n"
        "[[keys]]\nid = 'gpt-only'\n"
        f"sha256 = '{hashlib.sha256(b'gpt-key').hexdigest()}'\nmodels = ['gpt']\n"
    )
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        API_KEYS_FILE=keys,
        SERVED_MODELS="bert-embedder,gpt",
        CACHE_ENABLED=False,
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"query": QUERY, "documents": DOCUMENTS}
        spent, answers = 0, []
        for _ in range(10):
            answers.append(
                client.post("/v1/rerank", json=body, headers={"Authorization": "Bearer tokens-key"})
            )
            if answers[-1].status_code != 200:
                break
            spent += answers[-1].json()["usage"]["total_tokens"]
        assert answers[0].status_code == 200 and answers[-1].status_code == 429, answers[-1].text
        assert spent >= 60  # refused once the key's tokens per minute were spent on reranking
        assert metric(server.url, "tserve_quota_tokens_total", key="tokens") == spent
        other = client.post(
            "/v1/score", json={"text_1": "a", "text_2": "b"}, headers={"Authorization": "Bearer gpt-key"}
        )
        assert other.status_code == 404, other.text  # the embedder is not this key's: as if none served
