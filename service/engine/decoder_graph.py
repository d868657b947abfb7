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


class DecoderGraph:
    """The KV-cached GPT graph: a batched prefill with an empty past, and one decoding step.

    With an in-place step graph, ``start`` moves a prefill's cache into a ``KVBuffer`` and ``decode``
    updates it in place; otherwise caches stay ``KVCache`` and every step concatenates.
    """

    def __init__(self, graph: Graph, manifest: Manifest, inplace: Graph | None = None) -> None:
        self.layout = CacheLayout.of(required(manifest.kv_cache))
        self.pad_id = manifest.special_tokens.get("pad", manifest.token("eos"))
        self.max_length = required(manifest.max_sequence_length)  # the buffer's columns
        self._step = cuda_step(graph, self.layout) if graph.on_cuda else host_step(graph, self.layout)
        self._inplace = inplace_step(inplace, self.layout) if inplace is not None else None

    @property
    def in_place(self) -> bool:
        return self._inplace is not None

    def start(self, cache: KVCache) -> KVCache | KVBuffer:
        """The running batch's cache from its first prefilled rows: a buffer where steps run in place."""
        if self._inplace is None:
            return cache
        return KVBuffer(self.layout, self.max_length, capacity=max(8, cache.rows)).extend(cache)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, KVCache]:
        """Left-padded prompts with an empty past -> logits of each prompt's last token (n, V) and its cache."""
        logits, cache = self.prefill_all(prompts)  # (n, L, V)
        return logits[:, -1, :], cache

    def prefill_all(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, KVCache]:
        """``prefill`` with every position's logits (n, L, V), left-padded: prompt i's are ``[i, L - len:]``."""
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)  # (n,)
        width = int(lengths.max())
        ids = np.full((len(prompts), width), self.pad_id, dtype=np.int64)  # (n, L)
        mask = np.zeros((len(prompts), width), dtype=np.int64)  # (n, L)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            mask[row, width - len(prompt) :] = 1
        logits, present = self._step(
            ids, mask, positions_from_mask(mask, width), self.layout.empty(len(prompts))
        )
        return logits, KVCache(present, lengths, width)

    def decode(self, tokens: np.ndarray, cache: KVCache | KVBuffer) -> tuple[np.ndarray, KVCache | KVBuffer]:
        """One new token per row (B,) -> logits (B, V) and the cache one column wider (a buffer: in place)."""
        if isinstance(cache, KVBuffer):
            assert self._inplace is not None, "a KVBuffer needs the in-place step graph"
            return self._inplace(tokens, cache, {})[:, -1, :], cache
        mask = cache.attention_mask(new=1)  # (B, W + 1)
        logits, present = self._step(
            tokens.reshape(-1, 1).astype(np.int64), mask, positions_from_mask(mask, 1), cache.tensors
        )
        return logits[:, -1, :], KVCache(present, cache.lengths + 1, cache.width + 1)
