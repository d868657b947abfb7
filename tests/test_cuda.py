"""The CUDA path, run where a GPU is: every graph on CUDAExecutionProvider agrees with CPU, and the service serves on it.

Skipped on machines where ONNX Runtime cannot really use CUDA (checked from the
session's providers, not from get_available_providers()).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from parity import check_close, check_outputs_equal
from servers import LiveServer

from model_export.profiles import MODEL_NAMES
from service.engine.kv_cache import CacheLayout
from service.engine.manifest import required
from service.engine.repository import LoadedModel, ModelLoadError, load_model
from service.engine.runtime import CUDA, RuntimeOptions
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.image_inputs import to_pixel_values
from service.pipelines.text_inputs import pad_batch
from service.pipelines.translate import prepare_source
from service.settings import Settings

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def cuda_models(tiny_models: Path) -> dict[str, LoadedModel]:
    try:
        models = {name: load_model(tiny_models / name, RuntimeOptions(device="cuda")) for name in MODEL_NAMES}
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    return models


def _feeds(model: LoadedModel) -> dict[str, np.ndarray]:
    """A small real input for a model's single graph."""
    if model.task == "image-classification":
        images = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
        return {"pixel_values": to_pixel_values(images, required(model.manifest.preprocessing))}
    assert model.tokenizer is not None
    rows = [
        model.tokenizer.encode(t).ids
        for t in ("A man rides a horse.", "Peter lives in Berlin", "to be or not")
    ]
    if model.task == "text-generation":
        layout = CacheLayout.of(required(model.manifest.kv_cache))
        feeds = pad_batch(rows, 0)
        feeds.pop("token_type_ids")
        feeds["position_ids"] = np.clip(np.cumsum(feeds["attention_mask"], 1) - 1, 0, None)
        feeds.update(zip(layout.past_names, layout.empty(3), strict=True))
        return feeds
    return pad_batch(rows, model.manifest.token("pad"))


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if n != "translator"])
def test_graph_on_cuda_matches_cpu(cuda_models: dict[str, LoadedModel], tiny_models: Path, name: str) -> None:
    gpu = cuda_models[name]
    assert gpu.provider == CUDA
    cpu = load_model(tiny_models / name, RuntimeOptions(device="cpu"))
    feeds = _feeds(gpu)
    outputs = zip(gpu.graphs["model"].run(feeds), cpu.graphs["model"].run(feeds), strict=True)
    for i, (got, expected) in enumerate(outputs):
        check_close(got, expected, atol=1e-3, rtol=1e-3, name_a=f"CUDA output {i}", name_b=f"CPU output {i}")


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if n != "translator"])
def test_fp16_variant_on_cuda_stays_near_the_cpu_reference(tiny_models: Path, name: str) -> None:
    """fp16 on CUDA computes the reference's function to half precision: what its validation then scores."""
    try:
        gpu = load_model(tiny_models / name, RuntimeOptions(device="cuda", variant="fp16"))
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    if gpu.variant.name != "fp16":
        pytest.skip(f"{name} has no fp16 variant ({gpu.variant.reason})")
    cpu = load_model(tiny_models / name, RuntimeOptions(device="cpu", variant="reference"))
    feeds = _feeds(gpu)
    outputs = zip(gpu.graphs["model"].run(feeds), cpu.graphs["model"].run(feeds), strict=True)
    for i, (got, expected) in enumerate(outputs):
        assert got.dtype == expected.dtype == np.float32  # fp16 inside, fp32 at the graph's edges
        check_close(
            got, expected, atol=5e-2, rtol=2e-2, name_a=f"fp16 CUDA output {i}", name_b=f"fp32 CPU output {i}"
        )


def test_translator_on_cuda_decodes_like_cpu(cuda_models: dict[str, LoadedModel], tiny_models: Path) -> None:
    gpu = cuda_models["translator"]
    assert gpu.graphs["encoder"].on_cuda and gpu.graphs["decoder"].on_cuda
    cpu = load_model(tiny_models / "translator", RuntimeOptions(device="cpu"))
    assert gpu.tokenizer is not None
    texts = ("A dog runs.", "Two men play chess in a park.")
    sources = [prepare_source(gpu.manifest, gpu.tokenizer.encode(t).ids, 10)[0] for t in texts]  # as served
    on_gpu = Seq2SeqModel(gpu.graphs["encoder"], gpu.graphs["decoder"], gpu.manifest).beam_search(
        sources, 3, 10
    )
    on_cpu = Seq2SeqModel(cpu.graphs["encoder"], cpu.graphs["decoder"], cpu.manifest).beam_search(
        sources, 3, 10
    )
    check_outputs_equal(
        [r[0].tokens for r in on_gpu], [r[0].tokens for r in on_cpu], name_a="CUDA", name_b="CPU"
    )
    check_close(
        [r[0].score for r in on_gpu],
        [r[0].score for r in on_cpu],
        atol=1e-3,
        name_a="CUDA score",
        name_b="CPU score",
    )


def test_service_serves_on_cuda(cuda_models: dict[str, LoadedModel], tiny_models: Path) -> None:
    with (
        LiveServer(Settings(MODEL_REPOSITORY=tiny_models, DEVICE="cuda")) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
    ):
        models = client.get("/v1/models").json()
        providers = {m["name"]: m["execution_provider"] for m in models["data"]}
        assert set(providers.values()) == {CUDA}, providers
        generated = client.post(
            "/v1/generate", json={"prompt": "KING:", "max_new_tokens": 12, "temperature": 0}
        ).json()
        assert generated["results"][0]["finish_reason"] in ("length", "eos", "stop")
        streamed = client.post(
            "/v1/generate", json={"prompt": "KING:", "max_new_tokens": 12, "temperature": 0, "stream": True}
        )
        assert streamed.status_code == 200 and "event: done" in streamed.text
        assert client.post("/v1/translate", json={"text": "A dog runs.", "beam_size": 2}).status_code == 200
        assert (
            client.post(
                "/v1/extract", json={"task": "entities", "text": "Peter lives in Berlin."}
            ).status_code
            == 200
        )
