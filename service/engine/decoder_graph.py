"""Running a KV-cached decoder graph: a batched prefill with an empty past, then one token per step.

On CPU the cache goes in and out as numpy arrays; on CUDA it stays on the device
between steps (IO binding) and only the logits come back to the host. Every
position's logits come back (a decoding step has one); the sampler reads the last,
prompt log-probabilities (``prefill_all``) read the others at no extra cost.

Where the served variant has an in-place step graph (``LoadedModel.inplace``), the
prefill still runs the graph above, and its cache moves into a ``KVBuffer`` that every
decoding step updates in place (IO binding of ``past`` and ``present`` to the same
memory): no step copies the past.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import instances
from .cuda_graphs import SKIP_CAPTURE, batch_buckets, bucket_for, graph_id
from .device_kv import DeviceKVBuffer, RowMoves
from .kv_cache import CacheLayout, KVBuffer, KVCache, positions_from_mask, to_host
from .manifest import Manifest, required
from .runtime import Graph, ort

# (input_ids (B, T), attention_mask (B, P + T), position_ids (B, T), past) -> (logits (B, T, V), present)
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, list[Any]], tuple[np.ndarray, list[Any]]]


def host_step(graph: Graph, layout: CacheLayout) -> StepFn:
    """CPU path: numpy in, numpy out."""
    outputs = [graph.output_names[0], *layout.present_names]  # logits first

    def step(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[Any]) -> tuple[Any, Any]:
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        feeds.update(zip(layout.past_names, map(to_host, past), strict=True))
        logits, *present = graph.session.run(outputs, feeds)
        return logits, present  # (B, T, V), (B, H, P + T, Dh) each

    return step


def cuda_step(graph: Graph, layout: CacheLayout) -> StepFn:
    """CUDA path: IO binding, the present keys/values stay on the device and come back as the next past.

    A past that is a device OrtValue (the previous step's present, batch unchanged)
    is bound as is; a numpy past (after a join or a leave) is uploaded once. Only the
    logits need the host.
    """
    options = graph.session.get_provider_options().get("CUDAExecutionProvider", {})
    device_id = int(options.get("device_id", 0))

    def on_device(value: Any) -> Any:
        if isinstance(value, ort.OrtValue):
            return value
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", device_id)

    def step(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[Any]) -> tuple[Any, Any]:
        binding = graph.session.io_binding()
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        inputs.update(zip(layout.past_names, past, strict=True))
        bound = {name: on_device(value) for name, value in inputs.items()}  # kept alive for the run
        for name, value in bound.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(graph.output_names[0], "cpu")  # logits: the sampler needs them on the host
        for name in layout.present_names:
            binding.bind_output(name, "cuda", device_id)
        graph.session.run_with_iobinding(binding)
        logits, *present = binding.get_outputs()  # in the order bound
        return logits.numpy(), present  # (B, T, V) on the host, present on the device

    return step


# (input_ids (B,), buffer, other inputs by name) -> logits (B, 1, V); the buffer holds one more column per row
InPlaceStepFn = Callable[[np.ndarray, KVBuffer, dict[str, np.ndarray]], np.ndarray]


def inplace_step(graph: Graph, layout: CacheLayout) -> InPlaceStepFn:
    """CPU path of the in-place step graph: ``past_*`` and ``present_*`` bound to the same buffer memory.

    GroupQueryAttention sees ``past`` and ``present`` share one buffer and writes only the new
    column of each row, at ``seqlens_k`` (the row's length), attending over that row's prefix. The
    binding is kept while the rows and the buffers stay the same (most steps), and with it four small
    input arrays and the logits' array, bound by address too: a step then writes the new tokens and
    lengths into those arrays and runs, with no ONNX Runtime value made or read back per step (that
    was a fifth of a one-row GPT step on CPU).
    """
    logits_name = graph.output_names[0]
    vocab = graph.session.get_outputs()[0].shape[-1]
    element = layout.dtype.type
    # One binding per instance (MODEL_INSTANCES: each compute thread runs its own session, on its own rows).
    bound_by_instance: dict[int, dict[str, Any]] = {}

    def bind_array(binding: Any, name: str, array: np.ndarray, output: bool = False) -> np.ndarray:
        bind = binding.bind_output if output else binding.bind_input
        bind(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)
        return array

    def buffers_bound(buffer: KVBuffer) -> tuple[Any, dict[str, np.ndarray]]:
        # The very arrays bound (held here, so that no new array can take a freed one's address) and the
        # rows: cheaper to compare than addresses, which numpy makes a ctypes object for each time.
        key = (buffer.rows, *buffer.buffers)
        bound = bound_by_instance.get(instances.current())
        if bound is None:  # this instance's first step
            bound = bound_by_instance[instances.current()] = {"key": None, "binding": None, "arrays": None}
        held = bound["key"]
        if (
            held is not None
            and held[0] == key[0]
            and len(held) == len(key)
            and all(a is b for a, b in zip(held[1:], key[1:], strict=True))
        ):
            return bound["binding"], bound["arrays"]
        rows = buffer.rows
        binding = graph.session.io_binding()
        arrays: dict[str, np.ndarray] = {}
        if isinstance(vocab, int):  # first: get_outputs() keeps the order bound
            arrays["logits"] = bind_array(binding, logits_name, np.zeros((rows, 1, vocab), np.float32), True)
        else:
            binding.bind_output(logits_name, "cpu")
        for past, present, array in zip(layout.past_names, layout.present_names, buffer.buffers, strict=True):
            shape = [rows, *array.shape[1:]]  # the live rows: the buffer's first `rows`, contiguous
            binding.bind_input(past, "cpu", 0, element, shape, array.ctypes.data)
            binding.bind_output(present, "cpu", 0, element, shape, array.ctypes.data)
        arrays["input_ids"] = bind_array(binding, "input_ids", np.zeros((rows, 1), np.int64))
        arrays["position_ids"] = bind_array(binding, "position_ids", np.zeros((rows, 1), np.int64))
        arrays["seqlens_k"] = bind_array(binding, "seqlens_k", np.zeros(rows, np.int32))
        arrays["total_sequence_length"] = bind_array(binding, "total_sequence_length", np.zeros((), np.int32))
        bound["key"], bound["binding"], bound["arrays"] = key, binding, arrays
        return binding, arrays

    def step(tokens: np.ndarray, buffer: KVBuffer, other: dict[str, np.ndarray]) -> np.ndarray:
        lengths = buffer.lengths
        binding, arrays = buffers_bound(buffer)
        for name, value in other.items():  # the translator's cross keys/values and source mask
            binding.bind_cpu_input(name, value)
        arrays["input_ids"][:, 0] = tokens.reshape(-1)
        arrays["position_ids"][:, 0] = lengths  # a row's next position
        arrays["seqlens_k"][:] = lengths
        arrays["total_sequence_length"][...] = lengths.max() + 1
        graph.session.run_with_iobinding(binding)
        buffer.lengths = lengths + 1
        if "logits" in arrays:  # a copy: the bound array is the next step's output
            return arrays["logits"].copy()  # (B, 1, V)
        return binding.get_outputs()[0].numpy()  # (B, 1, V)

    return step


class DeviceStep:
    """The in-place step graph over a ``DeviceKVBuffer``: the cache never leaves the device.

    ``past_*`` and ``present_*`` are bound to the buffers' addresses, the small inputs (tokens, positions,
    ``seqlens_k``) are OrtValues on the device refreshed in place each step, the logits an OrtValue on the
    device read back once (the sampler needs them on the host); ``total_sequence_length`` is a host input of
    GroupQueryAttention. With ``capture`` (the session has ``enable_cuda_graph``) the batch is padded to a
    bucket (``cuda_graphs.batch_buckets``: the padding rows have an empty past and their outputs are
    dropped), and each bucket's binding is captured once as a CUDA graph and replayed; without, the batch
    runs at its own size (no padding). A binding holds for a bucket while the buffers stay where they are
    (``DeviceKVBuffer.generation``).
    """

    def __init__(self, graph: Graph, layout: CacheLayout, max_rows: int, capture: bool, device: str) -> None:
        self.graph, self.layout, self.capture, self.device = graph, layout, capture, device
        self.device_id = graph.device_id
        inputs = {i.name: i for i in graph.session.get_inputs()}
        self.dtype = np.dtype(
            np.float16 if inputs[layout.past_names[0]].type == "tensor(float16)" else np.float32
        )
        self.vocab = graph.session.get_outputs()[0].shape[-1]
        assert isinstance(self.vocab, int), "the step graph's logits have a fixed vocabulary"
        self.buckets = batch_buckets(max(max_rows, 1)) if capture else ()
        self.max_rows = max(max_rows, 1)
        self._bound: dict[tuple[int, int, int], dict[str, Any]] = {}
        self._buffer: DeviceKVBuffer | None = None  # when capturing: the one buffer every batch reuses
        self._serials: dict[int, int] = {}  # id(buffer) -> the order it was made in
        self.captured_steps = 0  # steps run at a bucket with a graph id (replayed on CUDA)
        self.plain_steps = 0

    def capacity(self, rows: int) -> int:
        """The rows a new buffer holds: the largest bucket when capturing (its address must not move)."""
        if self.capture:
            return max(self.buckets[-1], rows)
        return max(8, rows)

    def _entry(self, buffer: DeviceKVBuffer, rows: int, captured: bool) -> dict[str, Any]:
        key = (buffer.generation, rows, id(buffer))
        entry = self._bound.get(key)
        if entry is not None:
            return entry
        if not self.capture and len(self._bound) > 32:  # bindings of buffers long gone
            self._bound.clear()  # (never when capturing: a graph id's binding must stay what it captured)
        session, where, index = self.graph.session, self.device, self.device_id
        binding = session.io_binding()
        logits = ort.OrtValue.ortvalue_from_shape_and_type([rows, 1, self.vocab], np.float32, where, index)
        binding.bind_ortvalue_output(session.get_outputs()[0].name, logits)  # first: the order bound
        shape = [rows, *buffer.row_shape]
        for i, (past, present) in enumerate(
            zip(self.layout.past_names, self.layout.present_names, strict=True)
        ):
            pointer = buffer.pointer(i)
            binding.bind_input(past, where, index, self.dtype.type, shape, pointer)
            binding.bind_output(present, where, index, self.dtype.type, shape, pointer)
        small = {
            "input_ids": ort.OrtValue.ortvalue_from_shape_and_type([rows, 1], np.int64, where, index),
            "position_ids": ort.OrtValue.ortvalue_from_shape_and_type([rows, 1], np.int64, where, index),
            "seqlens_k": ort.OrtValue.ortvalue_from_shape_and_type([rows], np.int32, where, index),
        }
        for name, value in small.items():
            binding.bind_ortvalue_input(name, value)
        total = np.zeros((), np.int32)  # GroupQueryAttention reads it on the host
        binding.bind_input("total_sequence_length", "cpu", 0, np.int32, [], total.ctypes.data)
        options = ort.RunOptions()
        options.add_run_config_entry(
            "gpu_graph_id",
            str(
                graph_id(self._serials[id(buffer)] % 1000, buffer.generation % 1000, rows)
                if captured
                else SKIP_CAPTURE
            ),
        )
        entry = {"binding": binding, "logits": logits, "small": small, "total": total, "options": options}
        self._bound[key] = entry
        return entry

    def start(self, cache: KVCache, moves: RowMoves, max_length: int, rows_hint: int) -> DeviceKVBuffer:
        """A buffer for a running batch's first rows. When capturing, always the same one, emptied: the
        captured graphs hold its address (a new buffer would need graphs of its own, and an old graph id
        replayed over a freed buffer would write into memory no longer its own)."""
        capacity = self.capacity(max(rows_hint, cache.rows))
        held = self._buffer
        if self.capture and held is not None and held.capacity >= capacity:
            held.lengths = np.zeros(0, dtype=np.int64)
            return held.extend(cache)
        buffer = DeviceKVBuffer(self.layout, max_length, self.dtype, moves, capacity, fixed=self.capture)
        if self.capture:
            self._serials[id(buffer)] = len(self._serials)  # graph ids never shared between two buffers
            self._buffer = buffer
        return buffer.extend(cache)

    def __call__(self, tokens: np.ndarray, buffer: DeviceKVBuffer) -> np.ndarray:
        """One new token per live row -> logits (rows, 1, V) on the host; each row's buffer one column longer."""
        rows, lengths = buffer.rows, buffer.lengths
        bucket = bucket_for(rows, self.buckets) if self.capture else None
        padded = bucket or rows
        buffer.reserve(padded)
        entry = self._entry(buffer, padded, bucket is not None)
        ids = np.zeros((padded, 1), np.int64)
        ids[:rows, 0] = tokens.reshape(-1)
        positions = np.zeros((padded, 1), np.int64)
        positions[:rows, 0] = lengths
        seqlens = np.zeros(padded, np.int32)
        seqlens[:rows] = lengths
        entry["small"]["input_ids"].update_inplace(ids)
        entry["small"]["position_ids"].update_inplace(positions)
        entry["small"]["seqlens_k"].update_inplace(seqlens)
        entry["total"][...] = lengths.max() + 1
        self.graph.session.run_with_iobinding(entry["binding"], entry["options"])
        if bucket is not None:
            self.captured_steps += 1
        else:
            self.plain_steps += 1
        buffer.lengths = lengths + 1
        return entry["logits"].numpy()[:rows].copy()  # a copy: on CPU numpy() views the bound memory


# (new tokens (T,) of one row, buffer, row) -> logits (T, V); the row's T new columns written in place
InPlaceVerifyFn = Callable[[np.ndarray, KVBuffer, int], np.ndarray]


MAX_VERIFY_TOKENS = 32  # new tokens one in-place check takes at most (the pending token and a proposal)


def inplace_verify(graph: Graph, layout: CacheLayout) -> InPlaceVerifyFn | None:
    """Several new tokens for one row of a KVBuffer, in place: GroupQueryAttention takes a sequence over a
    past for a batch of one, so the row's slice of each buffer is bound as that batch. None when the step
    graph was exported for one new token (an older export: its ``input_ids`` is (B, 1)).

    As for ``inplace_step``, the binding of a row is kept while its buffers stay the same, with the small
    inputs and the logits bound by address to arrays of ``MAX_VERIFY_TOKENS`` columns: a check writes its
    tokens there and rebinds only their shapes."""
    ids = next(i for i in graph.session.get_inputs() if i.name == "input_ids")
    if ids.shape[1] == 1:
        return None
    logits_name = graph.output_names[0]
    vocab = graph.session.get_outputs()[0].shape[-1]
    element = layout.dtype.type
    held: dict[tuple[int, int], dict[str, Any]] = {}  # (instance, row) -> its binding, arrays, buffers

    def bound(buffer: KVBuffer, row: int) -> dict[str, Any]:
        key = (instances.current(), row)
        entry = held.get(key)
        if entry is not None and all(a is b for a, b in zip(entry["buffers"], buffer.buffers, strict=True)):
            return entry
        binding = graph.session.io_binding()
        for past, present, array in zip(layout.past_names, layout.present_names, buffer.buffers, strict=True):
            view = array[row : row + 1]  # (1, H, max_length, Dh): contiguous, in the buffer's own memory
            binding.bind_input(past, "cpu", 0, element, list(view.shape), view.ctypes.data)
            binding.bind_output(present, "cpu", 0, element, list(view.shape), view.ctypes.data)
        arrays: dict[str, np.ndarray] = {
            "input_ids": np.zeros(MAX_VERIFY_TOKENS, np.int64),
            "position_ids": np.zeros(MAX_VERIFY_TOKENS, np.int64),
            "seqlens_k": np.zeros(1, np.int32),
            "total_sequence_length": np.zeros((), np.int32),
        }
        binding.bind_input("seqlens_k", "cpu", 0, np.int32, [1], arrays["seqlens_k"].ctypes.data)
        binding.bind_input(
            "total_sequence_length", "cpu", 0, np.int32, [], arrays["total_sequence_length"].ctypes.data
        )
        if isinstance(vocab, int):
            arrays["logits"] = np.zeros((MAX_VERIFY_TOKENS, vocab), np.float32)
        pointers = {name: a.ctypes.data for name, a in arrays.items()}
        held[key] = {
            "buffers": list(buffer.buffers),
            "binding": binding,
            "arrays": arrays,
            "pointers": pointers,
        }
        return held[key]

    def verify(tokens: np.ndarray, buffer: KVBuffer, row: int) -> np.ndarray:
        length, new = int(buffer.lengths[row]), len(tokens)
        assert new <= MAX_VERIFY_TOKENS, f"at most {MAX_VERIFY_TOKENS} tokens in one check"
        entry = bound(buffer, row)
        binding, arrays, pointers = entry["binding"], entry["arrays"], entry["pointers"]
        arrays["input_ids"][:new] = tokens
        arrays["position_ids"][:new] = np.arange(length, length + new)
        arrays["seqlens_k"][0] = length + new - 1
        arrays["total_sequence_length"][...] = length + new
        binding.bind_input("input_ids", "cpu", 0, np.int64, [1, new], pointers["input_ids"])
        binding.bind_input("position_ids", "cpu", 0, np.int64, [1, new], pointers["position_ids"])
        if "logits" in arrays:
            binding.bind_output(logits_name, "cpu", 0, np.float32, [1, new, vocab], pointers["logits"])
            graph.session.run_with_iobinding(binding)
            return arrays["logits"][:new].copy()  # (T, V): the array is the next check's output
        binding.bind_output(logits_name, "cpu")
        graph.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()[0]  # (T, V)

    return verify


class DecoderGraph:
    """The KV-cached GPT graph: a batched prefill with an empty past, and one decoding step.

    With an in-place step graph, ``start`` moves a prefill's cache into a ``KVBuffer`` and ``decode``
    updates it in place; otherwise caches stay ``KVCache`` and every step concatenates.
    """

    def __init__(
        self,
        graph: Graph,
        manifest: Manifest,
        inplace: Graph | None = None,
        *,
        max_rows: int = 0,
        device_buffers: bool | None = None,
    ) -> None:
        """``max_rows``: the most rows the batch holds (MAX_RUNNING_SEQUENCES): device buffers of that many
        rows when CUDA graphs are captured. ``device_buffers``: keep the cache in ``DeviceKVBuffer``s on the
        step graph's provider (default: where the step graph runs on CUDA; True on CPU for the tests)."""
        self.layout = CacheLayout.of(required(manifest.kv_cache))
        self.pad_id = manifest.special_tokens.get("pad", manifest.token("eos"))
        self.max_length = required(manifest.max_sequence_length)  # the buffer's columns
        self._on_cuda = graph.on_cuda
        self._step = cuda_step(graph, self.layout) if graph.on_cuda else host_step(graph, self.layout)
        self._inplace: InPlaceStepFn | None = None
        self._verify_row: InPlaceVerifyFn | None = None
        self._device: DeviceStep | None = None
        self._moves: RowMoves | None = None
        self._max_rows = max_rows
        on_device = inplace is not None and (inplace.on_cuda if device_buffers is None else device_buffers)
        if inplace is not None and on_device:
            where = "cuda" if inplace.on_cuda else "cpu"
            self._device = DeviceStep(inplace, self.layout, max_rows, inplace.cuda_graph, where)
            self._moves = RowMoves(
                len(self.layout.past_names), self.layout.dtype, self._device.dtype, where, inplace.device_id
            )
        elif inplace is not None:
            self._inplace = inplace_step(inplace, self.layout)
            self._verify_row = inplace_verify(inplace, self.layout)

    @property
    def on_cuda(self) -> bool:
        return self._on_cuda

    @property
    def in_place(self) -> bool:
        return self._inplace is not None or self._device is not None

    @property
    def device_step(self) -> DeviceStep | None:
        """The step over device buffers, where the cache stays on the device (its counters: the benchmarks')."""
        return self._device

    def start(self, cache: KVCache) -> KVCache | KVBuffer | DeviceKVBuffer:
        """The running batch's cache from its first prefilled rows: a buffer where steps run in place (on the
        device where the step graph runs there)."""
        if self._device is not None:
            assert self._moves is not None
            return self._device.start(cache, self._moves, self.max_length, self._max_rows)
        if self._inplace is None:
            return cache
        return KVBuffer(self.layout, self.max_length, capacity=max(8, cache.rows)).extend(cache)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, KVCache]:
        """Left-padded prompts with an empty past -> logits of each prompt's last token (n, V) and its cache."""
        logits, cache = self.prefill_all(prompts)  # (n, L, V)
        return logits[:, -1, :], cache

    def prefill_all(
        self,
        prompts: Sequence[Sequence[int]],
        reused: Sequence[int] | None = None,
        prefixes: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[np.ndarray, KVCache]:
        """``prefill`` with every computed position's logits (n, T, V), left-padded: prompt i's are
        ``[i, T - len:]`` when nothing is reused.

        With a prefix cache, row i reuses the keys/values of its first ``reused[i]`` tokens
        (``prefixes[i]``: (past names, H, reused[i], Dh)) as its past, and only the rest of its prompt is
        computed. A row that reuses any must have exactly T new tokens (the longest rest), so that every
        row's tokens stay contiguous and right-aligned in the cache; its logits are then all T positions.
        """
        n = len(prompts)
        reused = list(reused) if reused is not None else [0] * n
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)  # (n,)
        new = int(max(length - r for length, r in zip(lengths.tolist(), reused, strict=True)))
        width = max(reused)  # the past's columns
        ids = np.full((n, new), self.pad_id, dtype=np.int64)  # (n, T)
        mask = np.zeros((n, width + new), dtype=np.int64)  # (n, P + T)
        past = self.layout.empty(n)
        if width:
            shape = (n, self.layout.num_heads, width, self.layout.head_dim)
            past = [np.zeros(shape, self.layout.dtype) for _ in self.layout.past_names]
        for row, (prompt, r) in enumerate(zip(prompts, reused, strict=True)):
            rest = prompt[r:]
            assert r == 0 or len(rest) == new, "a row that reuses a prefix computes exactly T new tokens"
            ids[row, new - len(rest) :] = rest
            mask[row, width - r : width] = 1
            mask[row, width + new - len(rest) :] = 1
            if r:
                prefix = prefixes[row] if prefixes is not None else None
                assert prefix is not None and prefix.shape[2] == r, "a reused prefix's keys/values"
                for k, tensor in enumerate(past):
                    tensor[row, :, width - r :] = prefix[k]
        logits, present = self._step(ids, mask, positions_from_mask(mask, new), past)
        return logits, KVCache(present, lengths, width + new)

    def verify(
        self, tokens: np.ndarray, counts: np.ndarray, cache: KVCache | KVBuffer | DeviceKVBuffer
    ) -> tuple[np.ndarray, list[np.ndarray], int]:
        """Several new tokens per row in one call (speculative decoding's check): row i's first
        ``counts[i]`` of ``tokens`` (B, T) after its cache -> the logits after each (B, T, V), the present
        keys/values on the host and the past width W they start after (for ``commit``).

        Runs the exported graph (any number of new tokens over a past): a KVBuffer's rows are gathered
        right-aligned into its past first (a DeviceKVBuffer's through the host: speculation runs on small
        batches). The columns past a row's count are masked (their positions stay in the table) and, being
        later, change nothing before them; their logits are not read.
        """
        if isinstance(cache, DeviceKVBuffer):
            cache = cache.host_cache()
        lengths = cache.lengths
        if isinstance(cache, KVBuffer):
            width = int(lengths.max(initial=0))
            shape = (cache.rows, self.layout.num_heads, width, self.layout.head_dim)
            past: list[Any] = [np.zeros(shape, self.layout.dtype) for _ in self.layout.past_names]
            for tensor, buffer in zip(past, cache.buffers, strict=True):
                for row, length in enumerate(lengths.tolist()):
                    tensor[row, :, width - length :] = buffer[row, :, :length]
        else:
            width, past = cache.width, cache.tensors
        new = tokens.shape[1]
        columns = np.arange(width + new)  # (W + T,)
        mask = (columns[None, :] >= (width - lengths)[:, None]) & (
            columns[None, :] < (width + counts)[:, None]
        )
        mask = mask.astype(np.int64)  # (B, W + T)
        logits, present = self._step(tokens.astype(np.int64), mask, positions_from_mask(mask, new), past)
        return logits, [to_host(t) for t in present], width

    @property
    def verifies_in_place(self) -> bool:
        """Whether ``verify_row`` can check several tokens of one row in its KVBuffer."""
        return self._verify_row is not None

    def verify_row(self, tokens: np.ndarray, buffer: KVBuffer, row: int) -> np.ndarray:
        """Row ``row``'s new ``tokens`` (T,) after its past, in place -> their logits (T, V). The T columns
        are written after the row's length; ``commit_row`` keeps the first few, the rest are never read."""
        assert self._verify_row is not None, "the in-place step graph takes one new token"
        return self._verify_row(tokens, buffer, row)

    def commit(
        self,
        cache: KVCache | KVBuffer | DeviceKVBuffer,
        present: list[np.ndarray],
        width: int,
        keep: Sequence[int],
    ) -> KVCache | KVBuffer | DeviceKVBuffer:
        """The cache after ``verify``, row i grown by its first ``keep[i]`` new columns (the tokens that
        turned out to be the sequence's); the rest are dropped. A DeviceKVBuffer takes its rows anew."""
        lengths = cache.lengths
        if isinstance(cache, DeviceKVBuffer):
            grown = self.commit(KVCache([], lengths, int(lengths.max(initial=0))), present, width, keep)
            assert isinstance(grown, KVCache)
            return cache.replace(grown)
        if isinstance(cache, KVBuffer):
            for buffer, tensor in zip(cache.buffers, present, strict=True):
                for row, (length, kept) in enumerate(zip(lengths.tolist(), keep, strict=True)):
                    buffer[row, :, length : length + kept] = tensor[row, :, width : width + kept]
            cache.lengths = lengths + np.asarray(keep, dtype=np.int64)
            return cache
        longer = lengths + np.asarray(keep, dtype=np.int64)
        new_width = int(longer.max(initial=0))
        tensors = []
        for tensor in present:
            out = np.zeros((*tensor.shape[:2], new_width, tensor.shape[3]), tensor.dtype)
            for row, (length, total) in enumerate(zip(lengths.tolist(), longer.tolist(), strict=True)):
                out[row, :, new_width - total :] = tensor[row, :, width - length : width - length + total]
            tensors.append(out)
        return KVCache(tensors, longer, new_width)

    def decode(
        self, tokens: np.ndarray, cache: KVCache | KVBuffer | DeviceKVBuffer
    ) -> tuple[np.ndarray, KVCache | KVBuffer | DeviceKVBuffer]:
        """One new token per row (B,) -> logits (B, V) and the cache one column wider (a buffer: in place)."""
        if isinstance(cache, DeviceKVBuffer):
            assert self._device is not None, "a DeviceKVBuffer needs the step graph on its device"
            return self._device(tokens, cache)[:, -1, :], cache
        if isinstance(cache, KVBuffer):
            assert self._inplace is not None, "a KVBuffer needs the in-place step graph"
            return self._inplace(tokens, cache, {})[:, -1, :], cache
        mask = cache.attention_mask(new=1)  # (B, W + 1)
        logits, present = self._step(
            tokens.reshape(-1, 1).astype(np.int64), mask, positions_from_mask(mask, 1), cache.tensors
        )
        return logits[:, -1, :], KVCache(present, cache.lengths + 1, cache.width + 1)
