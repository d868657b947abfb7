"""Attention maps: the exported attention graph against torch, and return_attention through the real API.

Numbers: every map is compared with the torch module's own probabilities (``MultiHeadAttention``
with ``record_weights`` on), rebuilt from the tiny models' trained checkpoints. The ONNX graph is
fp32 like torch: they agree to ~1e-7 (export records it), so 1e-5 leaves room for other CPUs. The
API rounds to 5 decimals (at most 5e-6 off per weight), so there 2e-5.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer

from model_export.attention_graphs import attention_module, attention_spec, recording
from model_export.recipes.common import Trained
from service.engine.manifest import Manifest, content_version
from service.pipelines.image_inputs import decode_image, to_pixel_values
from service.pipelines.translate import DecodingParams
from service.settings import Settings
from tests.servers import LiveServer

WITH_MAPS = ("translator", "bert-classifier", "bert-qa", "bert-tagger", "vit")
WITHOUT_MAPS = ("gpt", "bert-embedder")


def torch_maps(trained: Trained, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every layer's attention probabilities from the torch module itself, weights recording on."""
    found = attention_module(trained)
    assert found is not None
    module, _ = found
    with recording(module.attentions), torch.no_grad():
        outputs = module.eval()(*[torch.from_numpy(v) for v in feed.values()])
    return [o.numpy() for o in outputs]


def onnx_maps(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


@pytest.mark.parametrize("name", WITH_MAPS)
def test_the_attention_graph_matches_torch_and_rows_sum_to_one(tiny_models: Path, name: str) -> None:
    trained = Trained.load(tiny_models / ".work" / name / "trained.pt")
    found = attention_spec(trained, seed=777)  # other inputs than the export's parity check
    assert found is not None
    spec, kind, layers, heads = found
    manifest = Manifest.model_validate_json((tiny_models / name / "manifest.json").read_text())
    maps = manifest.attention_maps
    assert maps is not None and maps.file == "attention.onnx" and maps.file in manifest.files
    assert (maps.kind, maps.num_layers, maps.num_heads) == (kind, layers, heads)
    assert [t.name for t in maps.inputs] == list(spec.input_axes)
    for feed in spec.parity_inputs:
        got = onnx_maps(tiny_models / name / maps.file, feed)
        expected = torch_maps(trained, feed)
        assert len(got) == len(expected) == layers
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and g.shape[1] == heads
            assert float(np.abs(g - e).max()) < 1e-5
            np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-5)
            assert (g >= 0).all()


def test_masked_source_tokens_get_no_weight(tiny_models: Path) -> None:
    feed = {
        "input_ids": np.array([[5, 6, 7, 8, 0, 0]], dtype=np.int64),
        "attention_mask": np.array([[1, 1, 1, 1, 0, 0]], dtype=np.int64),
        "decoder_input_ids": np.array([[1, 9, 10]], dtype=np.int64),
    }
    for layer in onnx_maps(tiny_models / "translator" / "attention.onnx", feed):
        assert float(layer[..., 4:].max()) < 1e-6


@pytest.mark.parametrize("name", WITHOUT_MAPS)
def test_models_without_maps_have_no_section(tiny_models: Path, name: str) -> None:
    manifest = json.loads((tiny_models / name / "manifest.json").read_text())
    assert "attention_maps" not in manifest
    assert not (tiny_models / name / "attention.onnx").exists()


@pytest.mark.parametrize("name", WITH_MAPS)
def test_the_fast_path_graphs_have_no_attention_outputs(tiny_models: Path, name: str) -> None:
    """The served graphs (reference and every variant) output what they did before: no probabilities."""
    manifest = Manifest.model_validate_json((tiny_models / name / "manifest.json").read_text())
    files = [g.file for g in manifest.graphs.values()]
    files += [f for v in manifest.variants.values() for f in v.graphs.values()]
    assert "attention.onnx" not in files
    for file in files:
        outputs = [
            o.name for o in onnx.load(str(tiny_models / name / file), load_external_data=False).graph.output
        ]
        assert not [o for o in outputs if o.startswith("attention")], (file, outputs)
    for graph in manifest.graphs.values():
        assert not [o.name for o in graph.outputs if o.name.startswith("attention")]


def test_recording_is_off_by_default_and_restored() -> None:
    from model_export.models.layers import MultiHeadAttention

    attention = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    attention(x)
    assert attention.last_weights is None
    with recording([attention]):
        out, _ = attention(x)
        assert attention.last_weights is not None and attention.last_weights.shape == (1, 2, 3, 3)
    assert attention.record_weights is False and attention.last_weights is None
    plain, _ = attention(x)
    torch.testing.assert_close(out, plain)  # recording changes what is kept, not what is computed


# --- through the API ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_models: Path) -> Iterator[LiveServer]:
    """The response cache on (in-process), so that cached and attention answers can be told apart."""
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models)) as live:
        yield live


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _attention(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    result = response.json()["results"][0]
    return dict(result["attention"])


def _check_rows(weights: list[list[float]]) -> None:
    w = np.array(weights)
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-3)


def _png(value: int = 180) -> bytes:
    image = Image.new("L", (28, 28), color=0)
    image.paste(value, (8, 4, 20, 24))  # a light shape on black, like Fashion-MNIST
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "head"), [("bert-classifier", None), ("bert-classifier", 1), ("bert-tagger", 0)]
)
def test_bert_self_attention_matches_torch(
    api: httpx.Client, tiny_models: Path, name: str, head: int | None
) -> None:
    text = "Angela Merkel visited a gripping film in Berlin."
    if name == "bert-classifier":
        body: dict[str, Any] = {"text": text, "model": name, "return_attention": True, "attention_layer": 0}
        response = api.post(
            "/v1/classify", json={**body, "attention_head": head} if head is not None else body
        )
    else:
        body = {"task": "entities", "text": text, "return_attention": True, "attention_head": head}
        response = api.post("/v1/extract", json=body)
    got = _attention(response)
    trained = Trained.load(tiny_models / ".work" / name / "trained.pt")
    tokenizer = Tokenizer.from_file(str(tiny_models / name / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    feed = {
        "input_ids": np.array([ids], dtype=np.int64),
        "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
        "token_type_ids": np.zeros((1, len(ids)), dtype=np.int64),
    }
    maps = torch_maps(trained, feed)
    layer = 0 if name == "bert-classifier" else len(maps) - 1  # the default: the last layer
    probs = maps[layer][0]
    expected = probs.mean(0) if head is None else probs[head]
    assert (got["kind"], got["layer"], got["head"]) == ("self", layer, head)
    assert (got["num_layers"], got["num_heads"]) == (len(maps), probs.shape[0])
    assert got["rows"] == got["columns"] == [tokenizer.id_to_token(i) for i in ids]
    assert float(np.abs(np.array(got["weights"]) - expected).max()) < 2e-5
    _check_rows(got["weights"])


def test_translator_cross_attention_matches_torch(
    api: httpx.Client, server: LiveServer, tiny_models: Path
) -> None:
    text = "A man is riding a bicycle."
    response = api.post("/v1/translate", json={"text": text, "return_attention": True, "attention_layer": -1})
    got = _attention(response)
    # The same source ids and greedy tokens the service computed, then torch teacher-forced on them.
    pipeline = server.pipeline("translator")
    item = pipeline.prepare([text], DecodingParams())[0][0]
    best = pipeline.seq2seq.greedy([item.ids], min(item.max_new_tokens, 127))[0]
    bos, eos = pipeline.bos, pipeline.eos
    produced = [*best.tokens, eos] if best.finished else best.tokens
    trained = Trained.load(tiny_models / ".work" / "translator" / "trained.pt")
    feed = {
        "input_ids": np.array([item.ids], dtype=np.int64),
        "attention_mask": np.ones((1, len(item.ids)), dtype=np.int64),
        "decoder_input_ids": np.array([[bos, *produced[:-1]]], dtype=np.int64),
    }
    maps = torch_maps(trained, feed)
    expected = maps[-1][0].mean(0)  # (target, source)
    assert (got["kind"], got["layer"], got["head"]) == ("cross", len(maps) - 1, None)
    assert len(got["rows"]) == len(produced) and len(got["columns"]) == len(item.ids)
    assert got["columns"][-1] == "</s>"  # the source's own end marker is a column too
    assert float(np.abs(np.array(got["weights"]) - expected).max()) < 2e-5
    _check_rows(got["weights"])
    plain = api.post("/v1/translate", json={"text": text}).json()["results"][0]
    assert plain["text"] == response.json()["results"][0]["text"]


def test_vit_cls_to_patches_matches_torch(api: httpx.Client, tiny_models: Path) -> None:
    png = _png()
    response = api.post(
        "/v1/classify",
        json={"image": base64.b64encode(png).decode(), "return_attention": True, "attention_head": 0},
    )
    got = _attention(response)
    manifest = Manifest.model_validate_json((tiny_models / "vit" / "manifest.json").read_text())
    preprocessing = manifest.preprocessing
    assert preprocessing is not None
    pixels = to_pixel_values(decode_image(png, preprocessing, 10**6)[None], preprocessing)
    trained = Trained.load(tiny_models / ".work" / "vit" / "trained.pt")
    maps = torch_maps(trained, {"pixel_values": pixels})
    cls_row = maps[-1][0][0][0]  # last layer, batch 0, head 0, the [CLS] query
    side = manifest.config["image_size"] // manifest.config["patch_size"]
    assert (got["kind"], got["head"], got["grid"]) == ("cls_to_patches", 0, [side, side])
    weights = np.array(got["weights"])
    assert weights.shape == (side, side)
    assert float(np.abs(weights - cls_row[1:].reshape(side, side)).max()) < 2e-5
    assert abs(got["cls_weight"] - float(cls_row[0])) < 2e-5
    assert abs(weights.sum() + got["cls_weight"] - 1.0) < 1e-3
    upload = api.post(
        "/v1/classify/image",
        files={"file": ("shape.png", png, "image/png")},
        data={"return_attention": "true", "attention_head": "0"},
    )
    assert _attention(upload)["weights"] == got["weights"]


def test_qa_self_attention_covers_the_one_window(api: httpx.Client) -> None:
    body = {"task": "qa", "question": "Where is it?", "context": "It is in Paris.", "return_attention": True}
    got = _attention(api.post("/v1/extract", json=body))
    assert got["kind"] == "self" and got["rows"][0] == "[CLS]" and got["rows"].count("[SEP]") == 2
    _check_rows(got["weights"])
    long = {**body, "context": "It is in Paris, by the river. " * 200}
    response = api.post("/v1/extract", json=long)
    assert response.status_code == 422 and response.json()["error"]["field"] == "context"


def test_without_return_attention_nothing_changes(api: httpx.Client) -> None:
    """No attention key at all, and the answer is the same as with it; the cache keeps the two apart."""
    body = {"text": "a moving and beautiful film", "top_k": 2}
    first = api.post("/v1/classify", json=body).json()
    again = api.post("/v1/classify", json=body).json()
    assert "attention" not in first["results"][0] and again["cached"] is True
    with_maps = api.post("/v1/classify", json={**body, "return_attention": True}).json()
    assert with_maps["cached"] is False  # never answered from the cache...
    assert "attention" in with_maps["results"][0]
    after = api.post("/v1/classify", json=body).json()
    assert after["cached"] is True and "attention" not in after["results"][0]  # ...nor stored in it
    answer = dict(with_maps["results"][0])
    del answer["attention"]
    assert answer == first["results"][0]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/classify", {"texts": ["a", "b"], "return_attention": True}, "return_attention"),
        ("/v1/translate", {"texts": ["a"], "return_attention": True}, "return_attention"),
        ("/v1/extract", {"task": "entities", "texts": ["a"], "return_attention": True}, "return_attention"),
        ("/v1/classify", {"images": ["aGVsbG8="], "return_attention": True}, "return_attention"),
        ("/v1/classify", {"text": "a", "return_attention": True, "attention_layer": 99}, "attention_layer"),
        ("/v1/classify", {"text": "a", "return_attention": True, "attention_layer": -99}, "attention_layer"),
        (
            "/v1/classify",
            {"text": "a", "return_attention": True, "attention_layer": 10**30},
            "attention_layer",
        ),
        ("/v1/classify", {"text": "a", "return_attention": True, "attention_layer": "x"}, "attention_layer"),
        ("/v1/classify", {"text": "a", "return_attention": True, "attention_head": 99}, "attention_head"),
        ("/v1/classify", {"text": "a", "return_attention": True, "attention_head": -1}, "attention_head"),
        ("/v1/classify", {"text": "a", "attention_head": 0}, "attention_head"),
        ("/v1/classify", {"text": "a", "attention_layer": 0}, "attention_layer"),
        ("/v1/classify", {"text": "a", "return_attention": None}, "return_attention"),
        ("/v1/translate", {"text": "a", "return_attention": True, "max_new_tokens": 200}, "max_new_tokens"),
        ("/v1/embed", {"text": "a", "return_attention": True}, "return_attention"),
    ],
)
def test_bad_attention_requests_are_422_naming_the_field(
    api: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    response = api.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_multipart_attention_fields_are_checked(api: httpx.Client) -> None:
    files = {"file": ("shape.png", _png(), "image/png")}
    for data, field in (
        ({"attention_head": "0"}, "attention_head"),
        ({"return_attention": "true", "attention_layer": "9"}, "attention_layer"),
        ({"return_attention": "true", "attention_head": "-1"}, "attention_head"),
    ):
        response = api.post("/v1/classify/image", files=files, data=data)
        assert response.status_code == 422 and response.json()["error"]["field"] == field, response.text


def test_token_limit_and_a_model_without_maps(model_repo: Path) -> None:
    """ATTENTION_MAX_TOKENS bounds the input; a folder whose export has no attention graph says so."""
    folder = model_repo / "bert-classifier"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("attention_maps")
    manifest["files"].pop("attention.onnx")
    manifest["version"] = content_version(manifest["files"])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "attention.onnx").unlink()
    settings = Settings(MODEL_REPOSITORY=model_repo, ATTENTION_MAX_TOKENS=8, CACHE_ENABLED=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        response = client.post("/v1/classify", json={"text": "a fine film", "return_attention": True})
        assert response.status_code == 422 and response.json()["error"]["field"] == "return_attention"
        assert "no attention maps" in response.json()["error"]["message"]
        assert (
            client.post("/v1/classify", json={"text": "a fine film"}).status_code == 200
        )  # serves as before
        long = "Angela Merkel met Emmanuel Macron in Berlin to discuss the European Union."
        response = client.post(
            "/v1/extract", json={"task": "entities", "text": long, "return_attention": True}
        )
        assert response.status_code == 422 and response.json()["error"]["field"] == "text"
        assert "ATTENTION_MAX_TOKENS" in response.json()["error"]["message"]
        short = client.post(
            "/v1/extract", json={"task": "entities", "text": "Paris", "return_attention": True}
        )
        assert len(_attention(short)["rows"]) <= 8
        response = client.post(
            "/v1/translate", json={"text": "a", "return_attention": True, "max_new_tokens": 8}
        )
        assert response.status_code == 422 and response.json()["error"]["field"] == "max_new_tokens"
        capped = _attention(client.post("/v1/translate", json={"text": "a", "return_attention": True}))
        assert len(capped["rows"]) <= 8  # the default max_new_tokens is capped to fit
        image = base64.b64encode(_png()).decode()
        response = client.post("/v1/classify", json={"image": image, "return_attention": True})
        assert response.status_code == 422 and response.json()["error"]["field"] == "image"  # 17 > 8


def test_the_openapi_schema_documents_the_fields_and_the_map(api: httpx.Client) -> None:
    schema = api.get("/schema/openapi.json").json()["components"]["schemas"]
    for request in ("TranslateRequest", "ClassifyRequest", "ExtractRequest"):
        properties = schema[request]["properties"]
        assert {"return_attention", "attention_layer", "attention_head"} <= set(properties)
    attention = schema["AttentionOut"]["properties"]
    assert {"kind", "layer", "head", "rows", "columns", "weights", "grid", "cls_weight"} <= set(attention)
    assert attention["kind"]["enum"] == ["cross", "self", "cls_to_patches"]
    for result in ("TranslationOut", "ClassificationOut", "EntitiesOut", "AnswerOut"):
        assert "attention" in schema[result]["properties"]
