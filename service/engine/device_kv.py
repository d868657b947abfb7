"""The KV cache of a running batch kept on the decoder's device: rows join and leave without the host.

``KVBuffer`` (``kv_cache.py``) holds the in-place step graph's buffers as numpy arrays: right for CPU,
where host memory is the device. On CUDA the same layout lives in device memory, one ONNX Runtime value
per past name, (capacity, H, max_length, Dh), left-aligned rows, bound by address to the step graph as
both ``past`` and ``present`` (``decoder_graph.DeviceStep``). Joining and leaving move rows, and those
moves run on the device too, as three tiny graphs of their own (``onnx_writer``) on the decoder's provider:

- ``place`` (a join): a prefill's right-aligned cache (n, H, W, Dh), still on the device where the prefill
  left it, becomes n left-aligned rows of max_length columns, cast to the buffers' type (float32 -> float16
  for the fp16 step graph), written straight into rows ``[start, start + n)`` of each buffer (its output is
  bound to that address): ``GatherElements`` along the columns, each row shifted by ``W - length``;
- ``gather`` then ``copy`` (a leave): the rows kept after the first one that left are gathered into scratch
  memory, then copied down over the gap (two runs: one run reading and writing the same rows could race);
- ``copy`` (growth): the live rows into larger buffers.

A row's columns past its length hold whatever was there (a copy of its last column, or a dead row's
leftovers); the step graph never reads them. ``generation`` counts reallocations: a captured CUDA graph
holds the buffers' addresses, so one made before a reallocation is never replayed after it.

The same code runs on ONNX Runtime's CPU provider (``device="cpu"``), which is how the tests check it
against ``KVBuffer`` on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .kv_cache import CacheLayout, KVCache
from .onnx_writer import Node, Value, element_type, model_bytes
from .runtime import CPU, CUDA, ort

ROWS, HEADS, WIDTH, COLUMNS, DIM, MOVED = "rows", "heads", "width", "columns", "head_dim", "moved"


def place_graph(count: int, source: np.dtype, target: np.dtype) -> bytes:
    """``src_i`` (n, H, W, Dh) right-aligned, ``shift`` (n,) = W - length, ``columns`` (L,) = arange(L)
    -> ``dst_i`` (n, H, L, Dh) left-aligned (column c of row r is source column min(c + shift[r], W - 1))."""
    nodes = [
        Node("Unsqueeze", ["columns", "axis0"], ["columns_row"]),  # (1, L)
        Node("Unsqueeze", ["shift", "axis1"], ["shift_column"]),  # (n, 1)
        Node("Add", ["columns_row", "shift_column"], ["index_2d"]),  # (n, L)
        Node("Shape", ["src_0"], ["width"], ints={"start": 2, "end": 3}),  # (1,) = W
        Node("Sub", ["width", "one"], ["last"]),
        Node("Min", ["index_2d", "last"], ["index_clipped"]),
        Node("Unsqueeze", ["index_clipped", "axes13"], ["index_4d"]),  # (n, 1, L, 1)
        Node("Shape", ["src_0"], ["rows_heads"], ints={"start": 0, "end": 2}),  # (n, H)
        Node("Shape", ["columns"], ["length"]),  # (L,)
        Node("Shape", ["src_0"], ["dim"], ints={"start": 3, "end": 4}),  # (Dh,)
        Node("Concat", ["rows_heads", "length", "dim"], ["target_shape"], ints={"axis": 0}),
        Node("Expand", ["index_4d", "target_shape"], ["index"]),  # (n, H, L, Dh)
    ]
    for i in range(count):
        gathered = f"gathered_{i}" if source != target else f"dst_{i}"
        nodes.append(Node("GatherElements", [f"src_{i}", "index"], [gathered], ints={"axis": 2}))
        if source != target:
            nodes.append(Node("Cast", [gathered], [f"dst_{i}"], ints={"to": element_type(target)}))
    inputs = [Value(f"src_{i}", source, [ROWS, HEADS, WIDTH, DIM]) for i in range(count)]
    inputs += [Value("shift", np.int64, [ROWS]), Value("columns", np.int64, [COLUMNS])]
    outputs = [Value(f"dst_{i}", target, [ROWS, HEADS, COLUMNS, DIM]) for i in range(count)]
    constants = {"axis0": [0], "axis1": [1], "axes13": [1, 3], "one": [1]}
    return model_bytes("kv_place", nodes, inputs, outputs, constants)


def gather_graph(count: int, dtype: np.dtype) -> bytes:
    """``buf_i`` (R, H, L, Dh), ``index`` (k,) -> ``out_i`` (k, H, L, Dh): rows ``index`` of each buffer."""
    nodes = [Node("Gather", [f"buf_{i}", "index"], [f"out_{i}"], ints={"axis": 0}) for i in range(count)]
    inputs = [Value(f"buf_{i}", dtype, [ROWS, HEADS, COLUMNS, DIM]) for i in range(count)]
    inputs.append(Value("index", np.int64, [MOVED]))
    outputs = [Value(f"out_{i}", dtype, [MOVED, HEADS, COLUMNS, DIM]) for i in range(count)]
    return model_bytes("kv_gather", nodes, inputs, outputs)


def copy_graph(count: int, dtype: np.dtype) -> bytes:
    """``in_i`` -> ``out_i``: each output bound to the address it must be copied to."""
    nodes = [Node("Identity", [f"in_{i}"], [f"out_{i}"]) for i in range(count)]
    inputs = [Value(f"in_{i}", dtype, [ROWS, HEADS, COLUMNS, DIM]) for i in range(count)]
    outputs = [Value(f"out_{i}", dtype, [ROWS, HEADS, COLUMNS, DIM]) for i in range(count)]
    return model_bytes("kv_copy", nodes, inputs, outputs)


class RowMoves:
    """The three graphs that move KV rows, each in a session on the decoder's provider and device."""

    def __init__(self, count: int, source: np.dtype, target: np.dtype, device: str, device_id: int) -> None:
        self.device, self.device_id = device, device_id
        self.count, self.source, self.target = count, np.dtype(source), np.dtype(target)
        options = ort.SessionOptions()
        # As written: no optimizer may fold the Identity copies away (their outputs are bound addresses).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        providers: list[Any] = [(CUDA, {"device_id": device_id}), CPU] if device == "cuda" else [CPU]
        self.place = ort.InferenceSession(place_graph(count, self.source, self.target), options, providers)
        self.gather = ort.InferenceSession(gather_graph(count, self.target), options, providers)
        self.copy = ort.InferenceSession(copy_graph(count, self.target), options, providers)
        if device == "cuda" and self.place.get_providers()[0] != CUDA:
            raise RuntimeError("the KV row moves could not run on CUDA")

    def bind_region(self, binding: Any, name: str, output: bool, pointer: int, shape: Sequence[int]) -> None:
        bind = binding.bind_output if output else binding.bind_input
        bind(name, self.device, self.device_id, self.target.type, list(shape), pointer)

    def bind_value(self, binding: Any, name: str, value: Any) -> None:
        """A source tensor: an OrtValue already on this device as it is, anything else from the host."""
        if isinstance(value, ort.OrtValue) and value.device_name().lower() == self.device:
            binding.bind_ortvalue_input(name, value)
        else:
            host = value.numpy() if isinstance(value, ort.OrtValue) else value
            binding.bind_cpu_input(name, np.ascontiguousarray(host))


class DeviceKVBuffer:
    """``KVBuffer``'s layout and operations (``extend``, ``keep``, ``lengths``), its buffers on the device.

    ``fixed``: never reallocate once made (the capacity is the largest batch bucket; CUDA graphs hold the
    buffers' addresses); a batch that outgrows it is a bug, not a reason to reallocate.
    """

    def __init__(
        self,
        layout: CacheLayout,
        max_length: int,
        dtype: np.dtype,
        moves: RowMoves,
        capacity: int = 8,
        fixed: bool = False,
    ) -> None:
        self.layout, self.max_length, self.dtype, self.moves = layout, max_length, np.dtype(dtype), moves
        self.fixed = fixed
        self.generation = 0
        self.lengths = np.zeros(0, dtype=np.int64)
        self.buffers = self._allocate(capacity)
        self._columns = np.arange(max_length, dtype=np.int64)

    def _allocate(self, capacity: int) -> list[Any]:
        shape = [capacity, self.layout.num_heads, self.max_length, self.layout.head_dim]
        where, index = self.moves.device, self.moves.device_id
        return [
            ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype.type, where, index)
            for _ in self.layout.past_names
        ]

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return int(self.buffers[0].shape()[0])

    @property
    def width(self) -> int:
        return int(self.lengths.max(initial=0))

    @property
    def row_shape(self) -> tuple[int, int, int]:
        return (self.layout.num_heads, self.max_length, self.layout.head_dim)

    @property
    def row_bytes(self) -> int:
        heads, length, dim = self.row_shape
        return heads * length * dim * self.dtype.itemsize

    def pointer(self, index: int, row: int = 0) -> int:
        """The address of row ``row`` of buffer ``index``."""
        return int(self.buffers[index].data_ptr()) + row * self.row_bytes

    def reserve(self, rows: int) -> None:
        """At least ``rows`` rows of capacity: larger buffers (twice as many rows, or ``rows``) with the
        live rows copied over on the device."""
        if rows <= self.capacity:
            return
        assert not self.fixed, f"a fixed KV buffer of {self.capacity} rows cannot take {rows}"
        grown = self._allocate(max(2 * self.capacity, rows))
        if self.rows:
            shape = [self.rows, *self.row_shape]
            binding = self.moves.copy.io_binding()
            for i, (old, new) in enumerate(zip(self.buffers, grown, strict=True)):
                self.moves.bind_region(binding, f"in_{i}", False, int(old.data_ptr()), shape)
                self.moves.bind_region(binding, f"out_{i}", True, int(new.data_ptr()), shape)
            self.moves.copy.run_with_iobinding(binding)
        self.buffers = grown
        self.generation += 1

    def extend(self, joining: KVCache) -> DeviceKVBuffer:
        """Append ``joining``'s rows (a prefill's right-aligned cache, on the device or the host)."""
        n, start = joining.rows, self.rows
        assert int(joining.lengths.max(initial=0)) <= self.max_length, "a row longer than the buffer"
        if n == 0:
            return self
        self.reserve(start + n)
        binding = self.moves.place.io_binding()
        for i, tensor in enumerate(joining.tensors):
            self.moves.bind_value(binding, f"src_{i}", tensor)
            self.moves.bind_region(binding, f"dst_{i}", True, self.pointer(i, start), [n, *self.row_shape])
        binding.bind_cpu_input("shift", (joining.width - joining.lengths).astype(np.int64))
        binding.bind_cpu_input("columns", self._columns)
        self.moves.place.run_with_iobinding(binding)
        self.lengths = np.concatenate([self.lengths, joining.lengths.astype(np.int64)])
        return self

    def keep(self, rows: Sequence[int]) -> DeviceKVBuffer:
        """Keep ``rows`` (ascending), moved down to be the first ``len(rows)``: rows before the first gap stay
        where they are, the others are gathered and copied down, on the device."""
        assert list(rows) == sorted(rows), "rows keep their order"
        first = next((i for i, row in enumerate(rows) if row != i), len(rows))
        if first < len(rows):
            moved = np.asarray(rows[first:], dtype=np.int64)
            live = [self.rows, *self.row_shape]
            gather = self.moves.gather.io_binding()
            for i in range(len(self.buffers)):
                self.moves.bind_region(gather, f"buf_{i}", False, self.pointer(i), live)
                gather.bind_output(f"out_{i}", self.moves.device, self.moves.device_id)
            gather.bind_cpu_input("index", moved)
            self.moves.gather.run_with_iobinding(gather)
            scratch = gather.get_outputs()
            copy = self.moves.copy.io_binding()
            for i, value in enumerate(scratch):
                copy.bind_ortvalue_input(f"in_{i}", value)
                region = [len(moved), *self.row_shape]
                self.moves.bind_region(copy, f"out_{i}", True, self.pointer(i, first), region)
            self.moves.copy.run_with_iobinding(copy)
        self.lengths = self.lengths[np.asarray(rows, dtype=np.int64)]
        return self

    def host_rows(self) -> list[np.ndarray]:
        """Each buffer's live rows on the host, (rows, H, max_length, Dh): for checks and the rare host paths."""
        return [np.array(b.numpy()[: self.rows]) for b in self.buffers]

    def host_cache(self) -> KVCache:
        """The live rows as a right-aligned host ``KVCache`` (speculative decoding's batched check)."""
        width = self.width
        tensors = []
        for rows in self.host_rows():
            out = np.zeros((self.rows, *self.row_shape[:1], width, self.layout.head_dim), self.layout.dtype)
            for row, length in enumerate(self.lengths.tolist()):
                out[row, :, width - length :] = rows[row, :, :length]
            tensors.append(out)
        return KVCache(tensors, self.lengths.copy(), width)

    def replace(self, cache: KVCache) -> DeviceKVBuffer:
        """Every row anew from ``cache`` (the same rows, grown by a speculative step's kept tokens)."""
        self.lengths = np.zeros(0, dtype=np.int64)
        return self.extend(cache)
