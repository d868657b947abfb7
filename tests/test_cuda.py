"""The CUDA path, run where a GPU is: every graph on CUDAExecutionProvider agrees with CPU, and the service serves on it.

Skipped on machines where ONNX Runtime cannot really use CUDA (checked from the
session's providers, not from get_available_providers()).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

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


# --- the engine's own CUDA paths: the KV cache on the device, CUDA graphs, TensorRT ------------------


@pytest.fixture(scope="module")
def fp16_step(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT's in-place step graph in float16 (what pack.py carries for the default GPT): GroupQueryAttention's
    CUDA kernel takes float16 only."""
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "inplace_fp16.py"
    spec = importlib.util.spec_from_file_location("inplace_fp16", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.write_step_graph(tiny_models / "gpt", tmp_path_factory.mktemp("fp16-step"))
    return path


def _fp16_decoders(tiny_models: Path, step: Path, cuda_graphs: bool) -> tuple[LoadedModel, Any, Any]:
    from service.engine.decoder_graph import DecoderGraph
    from service.engine.runtime import Graph

    try:
        gpt = load_model(
            tiny_models / "gpt", RuntimeOptions(device="cuda", variant="fp16", kv_cache="concat")
        )
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    inplace = Graph(step, RuntimeOptions(device="cuda", cuda_graphs=cuda_graphs))
    on_device = DecoderGraph(gpt.graphs["model"], gpt.manifest, inplace, max_rows=6)
    concat = DecoderGraph(gpt.graphs["model"], gpt.manifest)
    return gpt, on_device, concat


def test_rows_move_on_the_gpu_as_in_the_host_buffer() -> None:
    """DeviceKVBuffer with CUDA OrtValues: joins (float32 prefill -> float16 rows), leaves and growth keep
    every row's prefix, as the numpy KVBuffer does."""
    from test_device_kv import LAYOUT, _prefill

    from service.engine.device_kv import DeviceKVBuffer, RowMoves
    from service.engine.kv_cache import KVBuffer

    rng = np.random.default_rng(3)
    try:  # sessions on CUDA, checked from their providers (get_available_providers() lists CUDA anyway)
        moves = RowMoves(len(LAYOUT.past_names), np.dtype(np.float32), np.dtype(np.float16), "cuda", 0)
    except RuntimeError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    device = DeviceKVBuffer(LAYOUT, 12, np.dtype(np.float16), moves, capacity=2)
    host = KVBuffer(LAYOUT, 12, capacity=2)
    assert device.buffers[0].device_name().lower() == "cuda"
    for round in range(8):
        joining = _prefill(rng, int(rng.integers(1, 4)), int(rng.integers(1, 10)))
        device.extend(joining)
        host.extend(joining)
        if round % 2:
            keep = sorted(rng.choice(device.rows, size=max(1, device.rows - 2), replace=False).tolist())
            device.keep(keep)
            host.keep(keep)
        for got, want in zip(device.host_rows(), host.buffers, strict=True):
            for row, length in enumerate(device.lengths.tolist()):
                check_close(
                    got[row, :, :length].astype(np.float32),
                    want[row, :, :length],
                    atol=2e-3,
                    name_a="CUDA rows",
                    name_b="host rows",
                )
    assert device.generation > 0


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_fp16_in_place_decoding_on_the_gpu_stays_near_the_concat_decoder(
    tiny_models: Path, fp16_step: Path, cuda_graphs: bool
) -> None:
    """The fp16 step graph over device buffers (bucketed and replayed as CUDA graphs with ``cuda_graphs``),
    rows joining and leaving: every step's logits within float16 rounding of the fp16 Concat decoder's."""
    from test_device_kv import _decode_with_joins_and_leaves

    gpt, on_device, concat = _fp16_decoders(tiny_models, fp16_step, cuda_graphs)
    step = on_device.device_step
    assert step is not None and step.device == "cuda" and step.dtype == np.float16
    assert step.capture is cuda_graphs
    want = _decode_with_joins_and_leaves(concat, gpt)
    got = _decode_with_joins_and_leaves(on_device, gpt)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        check_close(
            a, b, atol=5e-2, rtol=2e-2, name_a=f"in place on CUDA, step {i}", name_b=f"Concat, step {i}"
        )
    assert (step.captured_steps if cuda_graphs else step.plain_steps) == len(want)


def test_the_engine_serves_from_device_buffers(tiny_models: Path, fp16_step: Path) -> None:
    """The engine with the fp16 step graph on CUDA: rows join and leave a running batch whose cache never
    leaves the device; every stream completes, and the tokens are those of the fp16 Concat engine but for
    float16 near-ties."""
    from test_generation import GREEDY, requests, run_engine, solo, staggered

    gpt, _, _ = _fp16_decoders(tiny_models, fp16_step, cuda_graphs=False)
    from service.engine.runtime import Graph

    with_step = dataclasses.replace(gpt, inplace={"model": Graph(fp16_step, RuntimeOptions(device="cuda"))})
    reqs = requests(gpt, lambda i: GREEDY)
    concat = run_engine(gpt, lambda e: solo(e, reqs))
    shared = run_engine(with_step, lambda e: staggered(e, reqs), max_running=3)
    agree = [
        sum(a == b for a, b in zip(x.token_ids, y.token_ids, strict=False)) / max(len(y.token_ids), 1)
        for x, y in zip(shared, concat, strict=True)
    ]
    assert all(r.finish_reason in ("eos", "length", "stop") for r in shared)
    assert min(agree) >= 0.5 and sum(agree) / len(agree) >= 0.9, agree


def test_encoder_batches_replay_cuda_graphs_and_answer_as_plain_cuda(tiny_models: Path) -> None:
    """CUDA_GRAPHS=true: the classifier's batches padded to buckets and replayed answer as plain CUDA runs."""
    try:
        plain = load_model(tiny_models / "bert-classifier", RuntimeOptions(device="cuda"))
        captured = load_model(
            tiny_models / "bert-classifier", RuntimeOptions(device="cuda", cuda_graphs=True)
        )
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    graph = captured.graphs["model"]
    assert graph.cuda_graph and graph._captures is not None
    rng = np.random.default_rng(0)
    for rows in (1, 3, 3, 8, 40):  # 3 twice: the second replays; 40 is above the largest bucket
        texts = [rng.integers(5, 100, int(rng.integers(3, 20))).tolist() for _ in range(rows)]
        feeds = pad_batch(texts, 0)
        feeds = {n: feeds[n] for n in graph.input_names}
        for i, (a, b) in enumerate(zip(graph.run(feeds), plain.graphs["model"].run(feeds), strict=True)):
            check_close(a, b, atol=1e-3, rtol=1e-3, name_a=f"replayed {i}", name_b=f"plain {i}")
    capture = graph._captures[0]
    assert capture.captured_runs == 4 and capture.plain_runs == 1


def test_tensorrt_runs_the_encoders_where_its_libraries_are(tiny_models: Path, tmp_path: Path) -> None:
    """TENSORRT=true: the classifier on TensorRT (fp16, engines cached on disk) near the CUDA answers; where
    TensorRT's libraries are missing ONNX Runtime falls back to CUDA, and the test says so."""
    import ctypes

    try:
        ctypes.CDLL("libnvinfer.so.10")
    except OSError:
        pytest.skip("TensorRT's libnvinfer.so.10 is not on this machine")
    options = RuntimeOptions(device="cuda", tensorrt=True, tensorrt_cache_dir=str(tmp_path))
    try:
        trt = load_model(tiny_models / "bert-classifier", options)
        cuda = load_model(tiny_models / "bert-classifier", RuntimeOptions(device="cuda"))
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider here: {exc}")
    assert trt.graphs["model"].provider == "TensorrtExecutionProvider"
    feeds = _feeds(cuda)
    for a, b in zip(trt.graphs["model"].run(feeds), cuda.graphs["model"].run(feeds), strict=True):
        check_close(a, b, atol=5e-2, rtol=2e-2, name_a="TensorRT fp16", name_b="CUDA")
    assert any(tmp_path.iterdir()), "no engine was cached on disk"
