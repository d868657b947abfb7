"""The KV cache kept on the decoder's device, checked on ONNX Runtime's CPU provider.

On CUDA the running batch's buffers are device OrtValues that rows join and leave through three tiny
graphs of the engine's own (``service/engine/device_kv.py``), and the in-place step binds them by address,
padded to batch buckets where CUDA graphs replay (``DeviceStep``). All of that is device-agnostic: here it
runs with ``device="cpu"`` and is compared, number for number, with the numpy ``KVBuffer`` the CPU path
uses, and through the engine with the Concat decoder's tokens. ``tests/test_cuda.py`` runs the same on
CUDA where a GPU is.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from parity import check_close, check_outputs_equal
from test_generation import GREEDY, requests, run_engine, sampled, solo, staggered

from service.engine import continuous_batching
from service.engine.decoder_graph import DecoderGraph
from service.engine.device_kv import DeviceKVBuffer, RowMoves, copy_graph, gather_graph, place_graph
from service.engine.kv_cache import CacheLayout, KVBuffer, KVCache
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions

pytestmark = pytest.mark.timeout(300)
LAYOUT = CacheLayout(
    ["k.0", "v.0", "k.1", "v.1"], ["pk.0", "pv.0", "pk.1", "pv.1"], 2, 4, np.dtype(np.float32)
)


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))


@pytest.fixture(scope="module")
def gpt_concat(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu", kv_cache="concat"))


@pytest.mark.parametrize("target", [np.float32, np.float16])
def test_the_row_move_graphs_are_valid_onnx(target: type) -> None:
    """Written without the onnx package: the onnx package parses them and its full checker passes them."""
    for written in (
        place_graph(4, np.dtype(np.float32), np.dtype(target)),
        gather_graph(4, np.dtype(target)),
        copy_graph(4, np.dtype(target)),
    ):
        model = onnx.load_from_string(written)
        onnx.checker.check_model(model, full_check=True)
        assert len(model.graph.output) == 4


def _prefill(rng: np.random.Generator, rows: int, width: int) -> KVCache:
    """A right-aligned cache as a prefill leaves it: rows of different lengths, the longest ``width``."""
    lengths = rng.integers(1, width + 1, rows).astype(np.int64)
    lengths[0] = width
    tensors = [rng.standard_normal((rows, 2, width, 4)).astype(np.float32) for _ in LAYOUT.past_names]
    return KVCache(tensors, lengths, width)


@pytest.mark.parametrize("target", [np.float32, np.float16])
def test_rows_join_leave_and_grow_on_the_device_as_in_the_host_buffer(target: type) -> None:
    """Every row's valid prefix equals the numpy KVBuffer's after each join (with a cast to the buffers'
    type), leave (rows gathered, then copied down) and growth (live rows copied into larger buffers)."""
    rng = np.random.default_rng(7)
    moves = RowMoves(len(LAYOUT.past_names), np.dtype(np.float32), np.dtype(target), "cpu", 0)
    device = DeviceKVBuffer(LAYOUT, 12, np.dtype(target), moves, capacity=2)
    host = KVBuffer(LAYOUT, 12, capacity=2)
    tolerance = 0 if target is np.float32 else 2e-3  # float16 rounding of values around 1
    generations = []
    for round in range(8):
        joining = _prefill(rng, int(rng.integers(1, 4)), int(rng.integers(1, 10)))
        device.extend(joining)
        host.extend(joining)
        if round % 2:
            keep = sorted(rng.choice(device.rows, size=max(1, device.rows - 2), replace=False).tolist())
            device.keep(keep)
            host.keep(keep)
        generations.append(device.generation)
        assert device.lengths.tolist() == host.lengths.tolist()
        for got, want in zip(device.host_rows(), host.buffers, strict=True):
            assert got.dtype == np.dtype(target)
            for row, length in enumerate(device.lengths.tolist()):
                check_close(
                    got[row, :, :length].astype(np.float32),
                    want[row, :, :length],
                    atol=tolerance,
                    name_a="device",
                    name_b="host",
                )
    assert generations[-1] > 0, "the buffers never grew: the copy into larger buffers went untested"
    again = device.host_cache()  # right-aligned, as the Concat graph takes it (speculation's check)
    for got, want in zip(again.tensors, host.buffers, strict=True):
        for row, length in enumerate(again.lengths.tolist()):
            check_close(
                got[row, :, again.width - length :],
                want[row, :, :length],
                atol=tolerance,
                name_a="host_cache",
                name_b="host",
            )


def test_a_fixed_buffer_never_reallocates() -> None:
    """With CUDA graphs the buffers' addresses are captured: a fixed buffer refuses to grow."""
    moves = RowMoves(len(LAYOUT.past_names), np.dtype(np.float32), np.dtype(np.float32), "cpu", 0)
    device = DeviceKVBuffer(LAYOUT, 12, np.dtype(np.float32), moves, capacity=4, fixed=True)
    device.extend(_prefill(np.random.default_rng(0), 4, 5))
    pointers = [device.pointer(i) for i in range(4)]
    device.keep([1, 3])
    device.extend(_prefill(np.random.default_rng(1), 2, 3))
    assert [device.pointer(i) for i in range(4)] == pointers and device.generation == 0
    with pytest.raises(AssertionError, match="cannot take"):
        device.extend(_prefill(np.random.default_rng(2), 1, 3))


def _decode_with_joins_and_leaves(graph: DecoderGraph, gpt: LoadedModel) -> list[np.ndarray]:
    """A fixed scenario: three prompts, steps, a leave, two joins, steps, a leave: every step's logits."""
    assert gpt.tokenizer is not None
    prompts = [gpt.tokenizer.encode(t).ids for t in ("KING:", "O Romeo, Romeo!", "My lord,")]
    later = [gpt.tokenizer.encode(t).ids for t in ("To be, or not", "What say you?")]
    seen = []
    logits, first = graph.prefill(prompts)
    cache = graph.start(first)
    tokens = logits.argmax(-1)
    for step in range(12):
        if step == 4:
            cache = cache.keep([0, 2])
            tokens = tokens[[0, 2]]
        if step == 6:
            joined, prefilled = graph.prefill(later)
            cache = cache.extend(prefilled)
            tokens = np.concatenate([tokens, joined.argmax(-1)])
        if step == 9:
            cache = cache.keep([1, 2, 3])
            tokens = tokens[[1, 2, 3]]
        logits, cache = graph.decode(tokens, cache)
        seen.append(logits)
        tokens = logits.argmax(-1)
    return seen


@pytest.mark.parametrize("buckets", [False, True])
def test_decoding_on_device_buffers_equals_the_host_buffer(gpt: LoadedModel, buckets: bool) -> None:
    """The device step (buffers bound by address, small inputs refreshed in place; with ``buckets`` the
    batch padded to a CUDA-graph bucket) gives the numpy in-place step's logits at every step."""
    host = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    device = DecoderGraph(
        gpt.graphs["model"], gpt.manifest, gpt.inplace["model"], max_rows=6, device_buffers=True
    )
    assert device.device_step is not None
    device.device_step.capture = buckets  # as on CUDA with CUDA_GRAPHS=true (a CPU session has none)
    device.device_step.buckets = (1, 2, 4, 6) if buckets else ()
    want = _decode_with_joins_and_leaves(host, gpt)
    got = _decode_with_joins_and_leaves(device, gpt)
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        check_close(a, b, atol=1e-5, name_a=f"device step {step}", name_b=f"host step {step}")
    counted = device.device_step.captured_steps if buckets else device.device_step.plain_steps
    assert counted == len(want)


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_the_engine_on_device_buffers_gives_the_tokens_of_the_concat_engine(
    gpt: LoadedModel, gpt_concat: LoadedModel, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows joining and leaving a running batch at every length, the cache in device buffers throughout."""
    monkeypatch.setattr(
        continuous_batching, "DecoderGraph", functools.partial(DecoderGraph, device_buffers=True)
    )
    reqs = requests(gpt, (lambda i: GREEDY) if kind == "greedy" else (lambda i: sampled(300 + i)))
    concat_alone = run_engine(gpt_concat, lambda e: solo(e, reqs))
    shared = run_engine(gpt, lambda e: staggered(e, reqs), max_running=3)
    check_outputs_equal(
        [(r.token_ids, r.text, r.finish_reason) for r in shared],
        [(r.token_ids, r.text, r.finish_reason) for r in concat_alone],
        name_a="device buffers, staggered",
        name_b="Concat, alone",
    )


def test_speculative_checks_read_and_rewrite_device_buffers(gpt: LoadedModel) -> None:
    """Speculation's batched check reads a DeviceKVBuffer through the host and ``commit`` rewrites its rows:
    the same cache as the numpy buffer after the same check."""
    host = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    device = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"], device_buffers=True)
    assert gpt.tokenizer is not None
    prompts = [gpt.tokenizer.encode(t).ids for t in ("KING:", "To be, or not to be")]
    caches = []
    for graph in (host, device):
        _, first = graph.prefill(prompts)
        cache = graph.start(first)
        tokens = np.array([[5, 6, 7], [8, 9, 10]], np.int64)
        logits, present, width = graph.verify(tokens, np.array([3, 2]), cache)
        caches.append((logits, graph.commit(cache, present, width, [2, 1])))
    (want_logits, want), (got_logits, got) = caches
    check_close(got_logits, want_logits, atol=1e-5, name_a="device check", name_b="host check")
    assert isinstance(got, DeviceKVBuffer) and isinstance(want, KVBuffer)
    assert got.lengths.tolist() == want.lengths.tolist()
    for a, b in zip(got.host_rows(), want.buffers, strict=True):
        for row, length in enumerate(got.lengths.tolist()):
            check_close(a[row, :, :length], b[row, :, :length], atol=1e-5, name_a="device", name_b="host")


def test_when_capturing_every_batch_reuses_one_buffer(gpt: LoadedModel) -> None:
    """Captured CUDA graphs hold the buffers' addresses: a batch that empties and starts again gets the same
    buffer (emptied), never a new one that an old graph id would be replayed over."""
    device = DecoderGraph(
        gpt.graphs["model"], gpt.manifest, gpt.inplace["model"], max_rows=4, device_buffers=True
    )
    step = device.device_step
    assert step is not None
    step.capture, step.buckets = True, (1, 2, 4)
    assert gpt.tokenizer is not None
    prompts = [gpt.tokenizer.encode(t).ids for t in ("KING:", "My lord,", "O Romeo")]
    _, first = device.prefill(prompts[:2])
    held = device.start(first)
    assert isinstance(held, DeviceKVBuffer) and held.capacity == 4 and held.fixed
    pointers = [held.pointer(i) for i in range(len(held.buffers))]
    held.keep([])  # every row left
    _, again = device.prefill(prompts)
    restarted = device.start(again)
    assert restarted is held and restarted.rows == 3 and restarted.generation == 0
    assert [restarted.pointer(i) for i in range(len(restarted.buffers))] == pointers
    logits, _ = device.decode(np.array([5, 6, 7]), restarted)
    host = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    _, fresh = host.prefill(prompts)
    want, _ = host.decode(np.array([5, 6, 7]), host.start(fresh))
    check_close(logits, want, atol=1e-5, name_a="reused buffer", name_b="fresh host buffer")
