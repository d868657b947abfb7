"""CUDA graphs for the shapes that repeat: buckets, padding to them, and the captured runs of encoders.

ONNX Runtime's CUDA provider can capture a session's kernels as a CUDA graph (provider option
``enable_cuda_graph``) and replay them with one launch: a run then costs the GPU's time, not the host's
hundreds of kernel launches. A captured run must see the same shapes at the same addresses every time,
so inputs and outputs are bound OrtValues on the device (``IOBinding``), refreshed in place
(``OrtValue.update_inplace``), and each shape gets its own graph (run option ``gpu_graph_id``; ``-1``
runs without one). The shapes are made to repeat by padding: the decoder's running batch to a batch
bucket (``decoder_graph.DeviceStep``), an encoder's batch to a batch bucket and its tokens to a length
bucket (``EncoderCapture``). The bucket choices here are pure functions; ``tests/test_cuda_graphs.py``
checks them, and the padded runs, on ONNX Runtime's CPU provider.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SKIP_CAPTURE = -1  # gpu_graph_id for a run without a CUDA graph
SMALLEST_LENGTH_BUCKET = 16


def batch_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 8 rows up to ``max_rows`` (vLLM's capture sizes): a batch pads by at most 7
    rows (or to the next power of two below 8), and ``max_rows`` itself is always a bucket."""
    if max_rows < 1:
        return ()
    sizes = [b for b in (1, 2, 4) if b < max_rows]
    sizes += list(range(8, max_rows, 8))
    return (*sizes, max_rows)


def length_buckets(max_length: int, smallest: int = SMALLEST_LENGTH_BUCKET) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to ``max_length``, which is always the last."""
    sizes, size = [], smallest
    while size < max_length:
        sizes.append(size)
        size *= 2
    return (*sizes, max_length)


def bucket_for(value: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``value``, or None when none does (run it without a graph)."""
    return next((b for b in buckets if b >= value), None)


def graph_id(*indices: int) -> int:
    """A positive ``gpu_graph_id`` for a bucket's indices (0 is ONNX Runtime's own, -1 skips capture)."""
    value = 0
    for index in indices:
        assert 0 <= index < 1000, "a bucket index below 1000"
        value = value * 1000 + index
    return value + 1


@dataclass(frozen=True)
class InputAxes:
    """Which axis of each graph input is the batch and which the tokens, read from its symbolic dims."""

    batch: dict[str, int]  # input -> its batch axis (always 0 here)
    tokens: dict[str, int]  # input -> its token axis, for inputs that have one
    token_dim: str | None  # the symbolic name of the token axis

    @classmethod
    def of(cls, inputs: Sequence[Any]) -> InputAxes:
        """From ``session.get_inputs()``: axis 0 is the batch; a second symbolic axis shared by the inputs
        (``sequence``) is the tokens. Fixed axes (an image's channels and pixels) never pad."""
        token_dim = None
        for spec in inputs:
            if len(spec.shape) >= 2 and isinstance(spec.shape[1], str):
                token_dim = spec.shape[1]
                break
        tokens = {s.name: 1 for s in inputs if len(s.shape) >= 2 and s.shape[1] == token_dim and token_dim}
        return cls({s.name: 0 for s in inputs}, tokens, token_dim)


def pad_feeds(
    feeds: dict[str, np.ndarray], axes: InputAxes, rows: int, length: int | None
) -> dict[str, np.ndarray]:
    """``feeds`` padded to ``rows`` rows and ``length`` tokens: new token columns are zeros (the attention
    mask's zeros make them padding), new rows copy the first row (a real input: no kernel sees an empty
    mask); their outputs are cut away (``cut_outputs``)."""
    padded = {}
    for name, value in feeds.items():
        out = value
        axis = axes.tokens.get(name)
        if axis is not None and length is not None and value.shape[axis] < length:
            pad = [(0, 0)] * value.ndim
            pad[axis] = (0, length - value.shape[axis])
            out = np.pad(out, pad)
        if out.shape[0] < rows:
            extra = np.repeat(out[:1], rows - out.shape[0], axis=0)
            out = np.concatenate([out, extra], axis=0)
        padded[name] = np.ascontiguousarray(out)
    return padded


def cut_outputs(
    outputs: list[np.ndarray], token_axes: Sequence[int | None], rows: int, length: int
) -> list[np.ndarray]:
    """The real rows (and tokens, for outputs with a token axis) of padded outputs."""
    cut = []
    for value, axis in zip(outputs, token_axes, strict=True):
        value = value[:rows]
        if axis is not None:
            value = np.take(value, np.arange(length), axis=axis)
        cut.append(np.array(value))  # never a view of a bound output: the next run writes there
    return cut


class EncoderCapture:
    """An encoder graph's runs at bucketed shapes, each captured once as a CUDA graph and replayed.

    One IOBinding per (batch bucket, length bucket), with input and output OrtValues of that shape on the
    device, made on first use (ONNX Runtime captures on the first runs of a ``gpu_graph_id``). A batch
    larger than the largest bucket, or longer than the longest, runs without a graph (``SKIP_CAPTURE``).
    ``device`` is "cuda" where it serves; the tests run it on "cpu", where ONNX Runtime ignores the graph
    ids and the padding and cutting are what is checked.
    """

    def __init__(
        self,
        session: Any,
        max_rows: int,
        max_length: int | None,
        device: str = "cuda",
        device_id: int = 0,
    ) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.session, self.device, self.device_id = session, device, device_id
        self.axes = InputAxes.of(session.get_inputs())
        self.rows = batch_buckets(max_rows)
        self.lengths = length_buckets(max_length) if self.axes.token_dim and max_length else None
        outputs = session.get_outputs()
        self.output_names = [o.name for o in outputs]
        self.output_token_axes = [
            next((i for i, d in enumerate(o.shape) if i > 0 and d == self.axes.token_dim), None)
            if self.axes.token_dim
            else None
            for o in outputs
        ]
        self._types = {i.name: _numpy_type(i.type) for i in session.get_inputs()}
        self._bound: dict[tuple[int, int], dict[str, Any]] = {}
        self.captured_runs = 0  # runs at a bucket (captured on CUDA), for the benchmarks
        self.plain_runs = 0

    def _run_options(self, value: int) -> Any:
        options = self._ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(value))
        return options

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        rows = next(iter(feeds.values())).shape[0]
        length = None
        if self.lengths is not None:
            length = max(v.shape[a] for n, v in feeds.items() if (a := self.axes.tokens.get(n)) is not None)
        rows_bucket = bucket_for(rows, self.rows)
        length_bucket = bucket_for(length, self.lengths) if self.lengths is not None and length else None
        if rows_bucket is None or (self.lengths is not None and length_bucket is None):
            self.plain_runs += 1
            found = self.session.run(outputs, feeds, self._run_options(SKIP_CAPTURE))
            return list(found)
        entry = self._entry(rows_bucket, length_bucket or 0)
        for name, value in pad_feeds(feeds, self.axes, rows_bucket, length_bucket).items():
            entry["inputs"][name].update_inplace(value.astype(self._types[name], copy=False))
        self.session.run_with_iobinding(entry["binding"], entry["options"])
        self.captured_runs += 1
        every = [value.numpy() for value in entry["outputs"]]  # views on CPU: cut_outputs copies
        cut = cut_outputs(every, self.output_token_axes, rows, length or 0)
        if outputs is None:
            return cut
        return [cut[self.output_names.index(name)] for name in outputs]

    def _entry(self, rows: int, length: int) -> dict[str, Any]:
        key = (rows, length)
        entry = self._bound.get(key)
        if entry is not None:
            return entry
        ort = self._ort
        binding = self.session.io_binding()
        inputs = {}
        for spec in self.session.get_inputs():
            shape = [
                rows if i == 0 else (length if i == 1 and spec.name in self.axes.tokens else d)
                for i, d in enumerate(spec.shape)
            ]
            value = ort.OrtValue.ortvalue_from_shape_and_type(
                shape, self._types[spec.name], self.device, self.device_id
            )
            binding.bind_ortvalue_input(spec.name, value)
            inputs[spec.name] = value
        outputs = []
        for spec, axis in zip(self.session.get_outputs(), self.output_token_axes, strict=True):
            shape = [rows if i == 0 else (length if i == axis else d) for i, d in enumerate(spec.shape)]
            if not all(isinstance(d, int) for d in shape):
                raise ValueError(f"output {spec.name} has a dimension no bucket fixes: {spec.shape}")
            value = ort.OrtValue.ortvalue_from_shape_and_type(
                shape, _numpy_type(spec.type), self.device, self.device_id
            )
            binding.bind_ortvalue_output(spec.name, value)
            outputs.append(value)
        index = (self.rows.index(rows), self.lengths.index(length) if self.lengths else 0)
        entry = {
            "binding": binding,
            "inputs": inputs,
            "outputs": outputs,
            "options": self._run_options(graph_id(*index)),
        }
        self._bound[key] = entry
        return entry


_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def _numpy_type(onnx_type: str) -> type:
    return _TYPES[onnx_type]
