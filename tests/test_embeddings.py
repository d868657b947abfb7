"""Sentence embeddings (bert-embedder): the exported model against an independent reference, the service's
POST /v1/embed and OpenAI's POST /v1/embeddings (driven by the official ``openai`` client) on loopback.

The reference is computed straight from the checkpoint's files with plain torch: its own
``tokenizer.json`` (not this project's WordPiece set-up), its safetensors tensors by their Hugging Face
names (not this project's BERT module or weight mapping), Sentence-BERT's mean pooling and L2
normalisation. What it is compared with is what the service serves: the exported ONNX folder, run
through the service's own pipeline.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
import tritonclient.http as triton
from parity import check_close
from safetensors.torch import load_file
from servers import LiveServer, metric
from tokenizers import Tokenizer

from model_export.evaluate import evaluate_model
from model_export.export import export_model
from model_export.hf_checkpoint import DEFAULT_CHECKPOINT_DIR
from model_export.profiles import recipe_for
from model_export.recipes.bert import graphs, prepare_embedder
from model_export.recipes.common import BuildContext
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.pipelines.base import Building
from service.pipelines.embed import SentenceEmbedder
from service.settings import Settings

CPU = RuntimeOptions(device="cpu")
SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar on a porch at dusk.",
    "The central bank raised interest rates again this quarter.",
    "ok",
    "Transformers compare every token with every other token through self-attention, "
    "which is why their cost grows with the square of the sequence length.",
]


# --------------------------------------------------------------------------- independent reference


def reference_embeddings(checkpoint: Path, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 as sentence-transformers computes it, one text at a time (no padding), plain torch."""
    config = json.loads((checkpoint / "config.json").read_text())
    t = load_file(str(checkpoint / "model.safetensors"))
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    d, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    dh = d // heads

    def ln(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, (d,), t[prefix + ".weight"], t[prefix + ".bias"], eps)

    def dense(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return x @ t[prefix + ".weight"].T + t[prefix + ".bias"]

    out = []
    for text in texts:
        ids = torch.tensor(tokenizer.encode(text).ids)
        s = len(ids)
        x = (
            t["embeddings.word_embeddings.weight"][ids]
            + t["embeddings.position_embeddings.weight"][:s]
            + t["embeddings.token_type_embeddings.weight"][0]
        )
        x = ln(x, "embeddings.LayerNorm")  # (S, D)
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (
                dense(x, p + f"attention.self.{n}").view(s, heads, dh).transpose(0, 1)  # (H, S, dh)
                for n in ("query", "key", "value")
            )
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)  # (H, S, S)
            context = (probs @ v).transpose(0, 1).reshape(s, d)
            x = ln(dense(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            inner = dense(x, p + "intermediate.dense")
            inner = 0.5 * inner * (1.0 + torch.erf(inner / math.sqrt(2.0)))  # exact GELU
            x = ln(dense(inner, p + "output.dense") + x, p + "output.LayerNorm")
        out.append(F.normalize(x.mean(0), dim=-1))  # mean over the text's tokens, then unit length
    return torch.stack(out).numpy()


# --------------------------------------------------------------------------- the exported models


def embedder(model: LoadedModel) -> SentenceEmbedder:
    return SentenceEmbedder(model, Building(Settings()).policy())


def embed_now(pipeline: SentenceEmbedder, texts: list[str], normalize: bool = True) -> np.ndarray:
    """The pipeline's own encoding and batch step, without the queue (one padded batch)."""
    encoded = pipeline.encode(texts)
    vectors = pipeline.run_batch([e.ids for e in encoded])
    return np.stack([v.normalized if normalize else v.pooled for v in vectors])


@pytest.fixture(scope="module")
def checkpoint_embedder(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> LoadedModel:
    """bert-embedder exported from the all-MiniLM-L6-v2 checkpoint by the real builder (about 10 s)."""
    if not (DEFAULT_CHECKPOINT_DIR / "model.safetensors").is_file():
        pytest.skip(
            f"no all-MiniLM-L6-v2 checkpoint in {DEFAULT_CHECKPOINT_DIR}: the set-up fetches it "
            "(scripts/fetch_checkpoint.py); offline, only the masked-LM fallback is built"
        )
    out = tmp_path_factory.mktemp("embedder")
    recipe = recipe_for("default", "bert-embedder")
    ctx = BuildContext("bert-embedder", data_dir, out, "default", recipe, init_from=DEFAULT_CHECKPOINT_DIR)
    trained = prepare_embedder(ctx).run()
    export_model(ctx, trained, graphs(trained, seed=0))
    return load_model(out / "bert-embedder", CPU)


@pytest.mark.checkpoint
def test_served_embeddings_match_an_independent_reference(checkpoint_embedder: LoadedModel) -> None:
    served = embed_now(embedder(checkpoint_embedder), SENTENCES)  # one right-padded batch
    reference = reference_embeddings(DEFAULT_CHECKPOINT_DIR, SENTENCES)
    cosine = (served * reference).sum(1)
    print("cosine served vs reference:", np.round(cosine, 7))
    assert served.shape == (len(SENTENCES), 384)
    assert cosine.min() >= 0.999, cosine
    check_close(served, reference, atol=1e-4, name_a="served", name_b="reference")
    manifest = json.loads((checkpoint_embedder.path / "manifest.json").read_text())
    assert manifest["encoder"]["init_from"] == str(DEFAULT_CHECKPOINT_DIR)
    assert manifest["training"]["steps"] == manifest["training"]["planned_steps"] == 0


@pytest.mark.checkpoint
def test_checkpoint_embeddings_know_paraphrases_and_sentiment(
    checkpoint_embedder: LoadedModel, tmp_path: Path, data_dir: Path
) -> None:
    emb = embed_now(embedder(checkpoint_embedder), SENTENCES[:3])
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.3  # guitar paraphrase vs interest rates
    scores = evaluate_model(checkpoint_embedder.path.parent, "bert-embedder", data_dir, "validation", 200)
    print(scores)
    assert scores["centroid_accuracy"] >= 0.7 and scores["cosine_gap"] > 0


def test_tiny_embedder_is_the_masked_lm_encoder_and_says_so(tiny_models: Path) -> None:
    manifest = json.loads((tiny_models / "bert-embedder" / "manifest.json").read_text())
    assert manifest["task"] == "feature-extraction"
    assert manifest["encoder"]["init_from"] is None
    assert manifest["encoder"]["pretraining"]["objective"] == "masked-LM"
    assert "masked-LM" in manifest["training"]["objective"]
    assert manifest["training"]["planned_steps"] == 0 and manifest["training"]["curve"] is None
    dims = manifest["embedding"]["dimensions"]
    assert [o["shape"] for o in manifest["graphs"]["model"]["outputs"]] == [["batch", dims]] * 2
    validation = manifest["validation"]["validation"]
    assert 0 <= validation["centroid_accuracy"] <= 1 and -2 <= validation["cosine_gap"] <= 2


def test_padding_changes_nothing_and_normalisation_is_exact(tiny_models: Path) -> None:
    """Each text alone equals the same text in a padded batch; the normalised output is pooled / |pooled|."""
    pipeline = embedder(load_model(tiny_models / "bert-embedder", CPU))
    batched = embed_now(pipeline, SENTENCES)
    alone = np.concatenate([embed_now(pipeline, [s]) for s in SENTENCES])
    check_close(batched, alone, atol=1e-5, name_a="batched", name_b="alone")
    pooled = embed_now(pipeline, SENTENCES, normalize=False)
    norms = np.linalg.norm(pooled, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3)  # the raw mean is not unit length
    check_close(pooled / norms[:, None], batched, atol=1e-5, name_a="pooled / |pooled|", name_b="normalized")


# --------------------------------------------------------------------------- the service, on loopback


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, MAX_ITEMS=8, MAX_QUEUE_DELAY_MS=50)
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def http(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0)


def post_embed(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/embed", json={"cache": False, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def vectors(answer: dict[str, Any]) -> np.ndarray:
    return np.array([r["embedding"] for r in answer["results"]], dtype=np.float64)


def test_batch_equals_each_text_alone_and_concurrent_requests_batch(
    api: LiveServer, http: httpx.Client
) -> None:
    batch = post_embed(http, texts=SENTENCES)
    assert batch["model"] == "bert-embedder" and batch["cached"] is False
    dims = json.loads((api.pipeline("bert-embedder").model.path / "manifest.json").read_text())["embedding"]
    assert [r["dimensions"] for r in batch["results"]] == [dims["dimensions"]] * len(SENTENCES)
    calls_before = metric(api.url, "tserve_batch_size_count", model="bert-embedder")
    with ThreadPoolExecutor(len(SENTENCES)) as pool:  # separate requests, one queue: batched together
        alone = list(pool.map(lambda s: post_embed(http, text=s), SENTENCES))
    assert metric(api.url, "tserve_batch_size_count", model="bert-embedder") > calls_before
    check_close(
        vectors(batch),
        np.concatenate([vectors(a) for a in alone]),
        atol=1e-5,
        name_a="one request of 5 texts",
        name_b="5 requests of 1",
    )
    assert batch["usage"]["input_tokens"] == sum(a["usage"]["input_tokens"] for a in alone) > 0


def test_normalize_true_is_unit_length_and_false_is_the_pooled_mean(http: httpx.Client) -> None:
    unit = vectors(post_embed(http, texts=SENTENCES))
    raw = vectors(post_embed(http, texts=SENTENCES, normalize=False))
    check_close(np.linalg.norm(unit, axis=1), np.ones(len(SENTENCES)), atol=1e-5, name_a="|unit|", name_b="1")
    norms = np.linalg.norm(raw, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3), norms
    check_close(raw / norms[:, None], unit, atol=1e-5, name_a="raw / |raw|", name_b="normalize: true")


def test_repeated_request_is_a_cache_hit_keyed_on_normalize(http: httpx.Client) -> None:
    body = {"text": f"cache me {uuid.uuid4().hex}"}
    first = http.post("/v1/embed", json=body).json()
    second = http.post("/v1/embed", json=body).json()
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["results"] == first["results"] and second["model_version"] == first["model_version"]
    raw = http.post("/v1/embed", json={**body, "normalize": False}).json()
    assert raw["cached"] is False and raw["results"] != first["results"]  # normalize is part of the key
    assert http.post("/v1/embed", json={**body, "normalize": False}).json()["cached"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"texts": ["fine", "   "]}, "texts[1]"),
        ({"text": "fine", "normalize": "sometimes"}, "normalize"),
        ({"texts": ["x"] * 9}, "texts"),  # MAX_ITEMS is 8 here
        ({"text": "fine", "model": "gpt"}, "model"),  # a model of another task
        ({"text": "fine", "dimensions": 8}, "dimensions"),  # unknown on this route
    ],
)
def test_bad_input_is_a_422_naming_the_field(http: httpx.Client, body: dict[str, Any], field: str) -> None:
    response = http.post("/v1/embed", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_open_inference_v2_equals_embed(api: LiveServer, http: httpx.Client, binary: bool) -> None:
    """tritonclient with its defaults (binary tensors) and with JSON tensors: /v1/embed's vectors."""
    client = triton.InferenceServerClient(api.url.removeprefix("http://"), network_timeout=120)
    try:
        meta = client.get_model_metadata("bert-embedder")
        dims = meta["outputs"][0]["shape"][1]
        assert meta["outputs"][0] == {"name": "embedding", "datatype": "FP32", "shape": [-1, dims]}
        for normalize in (True, False):
            text = triton.InferInput("text", [len(SENTENCES)], "BYTES")
            text.set_data_from_numpy(
                np.array([s.encode() for s in SENTENCES], dtype=object), binary_data=binary
            )
            wanted = [triton.InferRequestedOutput("embedding", binary_data=binary)]
            result = client.infer(
                "bert-embedder", [text], outputs=wanted, parameters={"normalize": normalize}
            )
            got = result.as_numpy("embedding")
            expected = vectors(post_embed(http, texts=SENTENCES, normalize=normalize)).astype(np.float32)
            assert got.shape == (len(SENTENCES), dims) and np.array_equal(got, expected), normalize
        with pytest.raises(triton.InferenceServerException, match="normalize"):
            client.infer("bert-embedder", [text], parameters={"normalize": "sometimes"})
    finally:
        client.close()


def test_openai_client_float_and_base64_equal_embed(client: openai.OpenAI, http: httpx.Client) -> None:
    texts = SENTENCES[:3]
    ours = post_embed(http, texts=texts)
    expected = np.array([r["embedding"] for r in ours["results"]], dtype=np.float32)
    floats = client.embeddings.create(model="bert-embedder", input=texts, encoding_format="float")
    default = client.embeddings.create(model="bert-embedder", input=texts)  # base64, decoded by the client
    b64 = client.embeddings.create(model="bert-embedder", input=texts, encoding_format="base64")
    assert floats.object == "list" and floats.model == "bert-embedder"
    assert [d.index for d in floats.data] == [0, 1, 2] and all(d.object == "embedding" for d in floats.data)
    raw = [np.frombuffer(base64.b64decode(str(d.embedding)), dtype="<f4") for d in b64.data]
    for name, got in (
        ("float", [d.embedding for d in floats.data]),
        ("client default", [d.embedding for d in default.data]),
        ("base64", raw),
    ):
        assert np.array_equal(np.array(got, dtype=np.float32), expected), name  # the same float32 values
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == ours["usage"]["input_tokens"]
    single = client.embeddings.create(model="bert-embedder", input=texts[0], encoding_format="float")
    assert np.array_equal(np.array(single.data[0].embedding, dtype=np.float32), expected[0])


def test_openai_errors_are_openai_shaped(client: openai.OpenAI, http: httpx.Client) -> None:
    dims = len(client.embeddings.create(model="bert-embedder", input="x").data[0].embedding)
    assert client.embeddings.create(model="bert-embedder", input="x", dimensions=dims).data  # its own size
    with pytest.raises(openai.BadRequestError) as shortened:
        client.embeddings.create(model="bert-embedder", input="x", dimensions=dims // 2)
    assert shortened.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")
    for bad, param in (
        ({"input": [[101, 2023, 102]]}, "input"),  # token ids
        ({"input": []}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ):
        response = http.post("/v1/embeddings", json={"model": "bert-embedder", **bad})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert set(error) == {"message", "type", "param", "code"}
    token_ids = http.post("/v1/embeddings", json={"model": "bert-embedder", "input": [1, 2, 3]}).json()
    assert "token-id input is not supported" in token_ids["error"]["message"]
    wrong_task = http.post("/v1/embeddings", json={"model": "gpt", "input": "x"})
    assert wrong_task.status_code == 400 and wrong_task.json()["error"]["param"] == "model"
    paths = http.get("/schema/openapi.json").json()["paths"]
    assert {"400", "404", "429"} <= set(paths["/v1/embeddings"]["post"]["responses"])
    assert {"422", "404", "429"} <= set(paths["/v1/embed"]["post"]["responses"])
