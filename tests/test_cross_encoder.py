"""The served cross-encoder (task rerank, the tiny house ``bert-reranker``): its numbers against ONNX Runtime run
directly on the same pairs, batched against one pair at a time, through every door that ranks (the real
``cohere`` client, TEI's ``/rerank`` with raw scores, vLLM's ``/v1/score``, the v2 tensor door), and its
truncation and refusals. One live server for the module; the embedder is served beside it, so a request that
names no model must go to the reranker, and one that names the embedder still gets cosines.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as thttp
from servers import LiveServer, metric
from tokenizers import Tokenizer

from service.settings import Settings

QUERY = "Which instrument is the man playing?"
DOCUMENTS = [
    "The central bank raised interest rates again this quarter.",
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar on a porch at dusk.",
    "ok",
]
LONG = "Guitars were first made in Spain. " + "The weather report said rain again tomorrow. " * 20


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS="bert-reranker,bert-embedder",
        MAX_ITEMS=8,
        MAX_QUEUE_DELAY_MS=20,
        CACHE_ENABLED=False,  # every answer computed: the numbers compared are the model's
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def http(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


def direct_logits(tiny_models: Path, query: str, documents: list[str], max_len: int = 96) -> np.ndarray:
    """The reranker's graph run by ONNX Runtime itself, one pair at a time, on the tokenizer's own pair
    encoding cut as transformers' ``longest_first`` cuts it (``tokenizers``' own truncation)."""
    folder = tiny_models / "bert-reranker"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_len, strategy="longest_first")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for document in documents:
        e = tok.encode(query, document)
        feeds = {
            "input_ids": np.array([e.ids], np.int64),
            "attention_mask": np.array([e.attention_mask], np.int64),
            "token_type_ids": np.array([e.type_ids], np.int64),
        }
        names = {i.name for i in session.get_inputs()}
        out.append(float(session.run(None, {k: v for k, v in feeds.items() if k in names})[0].reshape(-1)[0]))
    return np.array(out)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def test_a_request_that_names_no_model_is_scored_by_the_cross_encoder(
    tiny_models: Path, http: httpx.Client
) -> None:
    logits = direct_logits(tiny_models, QUERY, [*DOCUMENTS, LONG])
    answer = http.post("/v1/rerank", json={"query": QUERY, "documents": [*DOCUMENTS, LONG]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "bert-reranker" and body["scored_by"] == "cross-encoder"
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert [scores[i] for i in range(len(logits))] == pytest.approx(list(sigmoid(logits)), abs=1e-5)
    assert [r["index"] for r in body["results"]] == list(np.argsort(-logits, kind="stable"))
    assert body["usage"]["total_tokens"] > len(DOCUMENTS) * 4


def test_pairs_batched_together_score_as_each_alone(http: httpx.Client) -> None:
    together = http.post("/v1/score", json={"text_1": QUERY, "text_2": DOCUMENTS}).json()
    alone = [
        http.post("/v1/score", json={"text_1": QUERY, "text_2": d}).json()["data"][0]["score"]
        for d in DOCUMENTS
    ]
    assert together["scored_by"] == "cross-encoder"
    assert [d["score"] for d in together["data"]] == pytest.approx(alone, abs=1e-5)


def test_the_cohere_client_and_teis_raw_scores(
    tiny_models: Path, api: LiveServer, http: httpx.Client
) -> None:
    logits = direct_logits(tiny_models, QUERY, DOCUMENTS)
    client = cohere.ClientV2(api_key="unused", base_url=api.url)
    answer = client.rerank(model="bert-reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in answer.results] == list(np.argsort(-logits, kind="stable")[:2])
    for r in answer.results:
        assert r.relevance_score == pytest.approx(float(sigmoid(logits[r.index])), abs=1e-5)
    raw = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert raw.status_code == 200 and raw.headers["x-scored-by"] == "cross-encoder", raw.text
    assert {r["index"]: r["score"] for r in raw.json()} == pytest.approx(dict(enumerate(logits)), abs=1e-5)
    squashed = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
    assert {r["index"]: r["score"] for r in squashed} == pytest.approx(
        dict(enumerate(sigmoid(logits))), abs=1e-5
    )


def test_naming_the_embedder_still_scores_by_cosine(http: httpx.Client) -> None:
    answer = http.post("/v1/score", json={"model": "bert-embedder", "text_1": QUERY, "text_2": DOCUMENTS[:2]})
    assert answer.status_code == 200 and answer.json()["scored_by"] == "cosine", answer.text
    vectors = http.post("/v1/embed", json={"texts": [QUERY, *DOCUMENTS[:2]]}).json()["results"]
    v = np.array([r["embedding"] for r in vectors], np.float64)
    assert [d["score"] for d in answer.json()["data"]] == pytest.approx(list(v[1:] @ v[0]), abs=1e-5)


def test_the_v2_tensor_door_takes_query_and_document(tiny_models: Path, api: LiveServer) -> None:
    client = thttp.InferenceServerClient(api.url.removeprefix("http://"))
    meta = client.get_model_metadata("bert-reranker")
    assert [t["name"] for t in meta["inputs"]] == ["query", "document"]
    tensors = []
    for name, values in (("query", [QUERY, QUERY]), ("document", DOCUMENTS[:2])):
        tensor = thttp.InferInput(name, [2], "BYTES")
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=object))
        tensors.append(tensor)
    result = client.infer("bert-reranker", tensors)
    logits = direct_logits(tiny_models, QUERY, DOCUMENTS[:2])
    np.testing.assert_allclose(result.as_numpy("raw_score"), logits, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("score"), sigmoid(logits), atol=1e-5)


def test_truncation_the_caller_chooses(http: httpx.Client) -> None:
    body = {"query": "Where were guitars first made?", "texts": ["Spain.", LONG]}
    refused = http.post("/rerank", json={**body, "truncate": False})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith("texts[1]:") and "truncate" in refused.json()["error"]

    def score(**options: object) -> float:
        ranks = http.post("/rerank", json={**body, "raw_scores": True, **options}).json()
        return float(next(r["score"] for r in ranks if r["index"] == 1))

    assert score(truncation_direction="left") != pytest.approx(score(), abs=1e-5)  # the other end kept
    cut = http.post("/v1/rerank", json={"query": body["query"], "documents": body["texts"]}).json()
    assert cut["results"] and math.isfinite(cut["results"][0]["relevance_score"])


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": ["d"] * 9}, "documents"),  # MAX_ITEMS is 8
        ("/v1/rerank", {"query": "", "documents": DOCUMENTS}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(http: httpx.Client, path: str, body: dict, field: str) -> None:
    answer = http.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field, answer.text


def test_the_reranker_is_metered_as_every_model(api: LiveServer, http: httpx.Client) -> None:
    before = metric(api.url, "tserve_batch_size_count", model="bert-reranker")
    assert http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS}).status_code == 200
    assert metric(api.url, "tserve_batch_size_count", model="bert-reranker") > before
