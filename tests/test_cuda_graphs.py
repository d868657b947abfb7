"""CUDA graphs and TensorRT, the parts that run without a GPU: buckets, padding, graph choice, provider options.

A CUDA graph replays one shape at fixed addresses, so the engine pads batches to buckets
(``service/engine/cuda_graphs.py``) and binds OrtValues it refreshes in place. The bucket choice is pure;
the padded, bound runs of an encoder are run here on ONNX Runtime's CPU provider (which ignores the graph
ids) and must answer exactly as the plain run. Which graphs get CUDA graphs or TensorRT, and the provider
options they are opened with, are checked as data. ``tests/test_cuda.py`` runs the captured paths on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from parity import check_close

from service.engine.cuda_graphs import (
    EncoderCapture,
    InputAxes,
    batch_buckets,
    bucket_for,
    cut_outputs,
    graph_id,
    length_buckets,
    pad_feeds,
)
from service.engine.manifest import Manifest
from service.engine.repository import encoder_roles, graph_options, load_model, read_manifest
from service.engine.runtime import (
    CPU,
    CUDA,
    TENSORRT,
    RuntimeOptions,
    create_session,
    providers_for,
    tensorrt_profile,
)
from service.pipelines.text_inputs import pad_batch


def test_batch_buckets_pad_by_little_and_end_at_the_largest_batch() -> None:
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(1) == (1,)
    assert batch_buckets(0) == ()
    for rows in range(1, 65):  # every batch has a bucket, never more than 7 rows above it
        bucket = bucket_for(rows, batch_buckets(64))
        assert bucket is not None and rows <= bucket <= rows + 7


def test_length_buckets_double_up_to_the_window() -> None:
    assert length_buckets(256) == (16, 32, 64, 128, 256)
    assert length_buckets(100) == (16, 32, 64, 100)
    assert length_buckets(16) == (16,)
    assert bucket_for(17, length_buckets(256)) == 32
    assert bucket_for(257, length_buckets(256)) is None  # longer than any bucket: runs without a graph


def test_graph_ids_are_positive_and_distinct_per_bucket() -> None:
    ids = {graph_id(r, t) for r in range(11) for t in range(5)}
    assert len(ids) == 55 and min(ids) >= 1  # 0 is ONNX Runtime's own graph, -1 skips capture


class _Spec:
    def __init__(self, name: str, shape: list[object]) -> None:
        self.name, self.shape = name, shape


def test_token_axes_come_from_the_inputs_symbolic_dims() -> None:
    text = InputAxes.of(
        [_Spec("input_ids", ["batch", "sequence"]), _Spec("attention_mask", ["batch", "sequence"])]
    )
    assert text.token_dim == "sequence" and text.tokens == {"input_ids": 1, "attention_mask": 1}
    image = InputAxes.of([_Spec("pixel_values", ["batch", 1, 28, 28])])
    assert image.token_dim is None and image.tokens == {}


def test_padding_adds_masked_columns_and_copies_of_the_first_row() -> None:
    axes = InputAxes.of([_Spec("input_ids", ["b", "s"]), _Spec("attention_mask", ["b", "s"])])
    feeds = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 0]]),
        "attention_mask": np.array([[1, 1, 1], [1, 1, 0]]),
    }
    padded = pad_feeds(feeds, axes, rows=4, length=5)
    assert padded["input_ids"].tolist() == [
        [5, 6, 7, 0, 0],
        [8, 9, 0, 0, 0],
        [5, 6, 7, 0, 0],
        [5, 6, 7, 0, 0],
    ]
    assert padded["attention_mask"][:2].tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    outputs = [np.arange(4 * 5 * 2).reshape(4, 5, 2), np.arange(4 * 3).reshape(4, 3)]
    cut = cut_outputs(outputs, [1, None], rows=2, length=3)
    assert cut[0].shape == (2, 3, 2) and cut[1].shape == (2, 3)
    assert cut[0].tolist() == outputs[0][:2, :3].tolist()


@pytest.mark.parametrize("name", ["bert-classifier", "bert-tagger", "bert-qa", "vit"])
def test_padded_bound_runs_answer_as_the_plain_run(tiny_models: Path, name: str) -> None:
    """The encoder's run through its buckets (inputs padded, OrtValues refreshed in place, outputs cut)
    equals the plain run, for batches of every size, including one above the largest bucket."""
    model = load_model(tiny_models / name, RuntimeOptions(device="cpu"))
    graph = model.graphs["model"]
    length = model.manifest.max_sequence_length if name != "vit" else None
    capture = EncoderCapture(graph.session, max_rows=4, max_length=length, device="cpu")
    rng = np.random.default_rng(0)
    for rows in (1, 3, 4, 6):
        if name == "vit":
            feeds = {graph.input_names[0]: rng.standard_normal((rows, 1, 28, 28)).astype(np.float32)}
        else:
            texts = [rng.integers(5, 100, int(rng.integers(3, 12))).tolist() for _ in range(rows)]
            batch = pad_batch(texts, 0)
            feeds = {n: batch[n] for n in graph.input_names}
        want = graph.session.run(None, feeds)
        got = capture.run(feeds)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a.shape == b.shape
            check_close(a, b, atol=1e-5, name_a=f"bucketed output {i}", name_b=f"plain output {i}")
    assert capture.plain_runs == 1 and capture.captured_runs == 3  # 6 rows: above the largest bucket


def test_only_the_encoders_get_cuda_graphs_and_tensorrt(tiny_models: Path) -> None:
    """An encoder's graph keeps both, with its window for the shape profile; the decoders' graphs lose both
    (their step graph captures apart, in DeviceStep)."""
    options = RuntimeOptions(device="cpu", cuda_graphs=True, tensorrt=True)
    for name in ("bert-classifier", "vit", "gpt", "translator"):
        manifest: Manifest = read_manifest(tiny_models / name)
        for role in manifest.graphs:
            chosen = graph_options(options, manifest, role)
            encoder = role in encoder_roles(manifest)
            assert encoder == (name in ("bert-classifier", "vit"))
            assert chosen.cuda_graphs is encoder and chosen.tensorrt is encoder
            if encoder:
                assert chosen.max_length == (manifest.max_sequence_length or 0)


def test_provider_options_as_documented() -> None:
    """CUDA: no TF32, ``enable_cuda_graph`` when asked; TensorRT first (fp16, the engine and timing caches on
    disk), then CUDA, then CPU; CPU alone without CUDA."""
    plain = RuntimeOptions(device="cuda", cuda_device_id=1)
    assert providers_for(plain, want_cuda=False) == [CPU]
    assert providers_for(plain, want_cuda=True) == [(CUDA, {"device_id": 1, "use_tf32": 0}), CPU]
    graphs = providers_for(RuntimeOptions(cuda_graphs=True), want_cuda=True)
    assert graphs[0] == (CUDA, {"device_id": 0, "use_tf32": 0, "enable_cuda_graph": "1"})
    trt = RuntimeOptions(tensorrt=True, tensorrt_cache_dir="/var/cache/trt")
    profile = {"trt_profile_min_shapes": "x:1x1"}
    first, second, third = providers_for(trt, want_cuda=True, profile=profile)
    assert first[0] == TENSORRT and second[0] == CUDA and third == CPU
    assert first[1] == {
        "device_id": 0,
        "trt_fp16_enable": "True",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": "/var/cache/trt",
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": "/var/cache/trt",
        "trt_profile_min_shapes": "x:1x1",
    }


def test_the_tensorrt_profile_spans_one_token_to_the_window() -> None:
    inputs = [_Spec("input_ids", ["batch", "sequence"]), _Spec("attention_mask", ["batch", "sequence"])]
    profile = tensorrt_profile(inputs, max_rows=32, max_length=128)
    assert profile == {
        "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1",
        "trt_profile_opt_shapes": "input_ids:32x32,attention_mask:32x32",
        "trt_profile_max_shapes": "input_ids:32x128,attention_mask:32x128",
    }
    image = tensorrt_profile([_Spec("pixel_values", ["batch", 1, 28, 28])], max_rows=16, max_length=1)
    assert image["trt_profile_max_shapes"] == "pixel_values:16x1x28x28"


def test_no_cuda_means_no_cuda_graph_nor_tensorrt(tiny_models: Path) -> None:
    """On a machine without CUDA both settings change nothing: CPU sessions, plain runs (the CPU path stays
    the tested one)."""
    model = load_model(
        tiny_models / "bert-classifier", RuntimeOptions(device="auto", cuda_graphs=True, tensorrt=True)
    )
    graph = model.graphs["model"]
    assert graph.provider == CPU and not graph.cuda_graph and graph._captures is None
    session = create_session(graph.path, RuntimeOptions(device="cpu", cuda_graphs=True))
    assert session.get_providers() == [CPU]
