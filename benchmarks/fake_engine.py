"""A fake engine for measuring the request path alone: ONNX Runtime sessions that compute nothing.

``FakeSession`` stands where ``onnxruntime.InferenceSession`` stands (``service.engine.runtime``'s
``create_session``): the same inputs and outputs, read from the ONNX file, and on each ``run`` arrays of
the declared dtypes in the shapes the feeds give (a named axis takes its size from the input that names
it; ``total_sequence``, ``source_sequence`` and the like all appear among a graph's inputs), after
``FAKE_SERVICE_MS`` milliseconds per call (one batch; 0 by default). Everything above it is the real
service: the doors, admission, the cache, tokenization, the batchers and continuous batching, the KV
cache bookkeeping, sampling, detokenization, metrics and traces. The vLLM front end was measured the
same way (its mock engine).

So that generation runs its whole length, a ``logits`` output peaks at one ordinary token of the model's
vocabulary (the last token of " the", or of "a"), never at a special token: greedy decoding and beam
search then emit that token until ``max_new_tokens``.

Never on the served path: ``benchmarks/fake_serve.py`` installs it before ``python -m service`` builds
its app. The in-place KV step graphs bind buffers through IO binding, which a fake session does not
have, so the fake service decodes with the Concat step (``KV_CACHE=concat``, set by the launcher).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from tokenizers import Tokenizer

_DTYPES = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
    TensorProto.BOOL: np.bool_,
}
_ORT_TYPES = {np.float32: "tensor(float)", np.float16: "tensor(float16)", np.int64: "tensor(int64)"}


@dataclass(frozen=True)
class FakeIO:
    """What ``InferenceSession.get_inputs()`` / ``get_outputs()`` give: a name, a shape, a type."""

    name: str
    shape: list[int | str]
    dtype: Any

    @property
    def type(self) -> str:
        return _ORT_TYPES.get(self.dtype, "tensor(float)")


def _ios(values: Any) -> list[FakeIO]:
    out = []
    for value in values:
        tensor = value.type.tensor_type
        shape: list[int | str] = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        out.append(FakeIO(value.name, shape, _DTYPES.get(tensor.elem_type, np.float32)))
    return out


def _peak_token(folder: Path) -> int | None:
    """An ordinary token of the model's vocabulary (not special), for the logits to peak at."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    tokenizer = Tokenizer.from_file(str(path))
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    for text in (" the", "the", "a", "e"):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if ids and tokenizer.id_to_token(ids[-1]) not in special:
            return int(ids[-1])
    return None


def _model_folder(path: Path) -> Path:
    """The folder whose manifest lists ``path`` (a flat model folder, or a numbered version folder)."""
    for folder in (path.parent, path.parent.parent):
        manifest = folder / "manifest.json"
        if manifest.is_file() and path.name in json.loads(manifest.read_text()).get("files", {}):
            return folder
    return path.parent


class FakeSession:
    """An ``InferenceSession`` look-alike on ``path``'s inputs and outputs that computes nothing."""

    def __init__(self, path: Path, service_s: float) -> None:
        graph = onnx.load(str(path), load_external_data=False).graph
        initializers = {i.name for i in graph.initializer}
        self._inputs = [io for io in _ios(graph.input) if io.name not in initializers]
        self._outputs = _ios(graph.output)
        self._service_s = service_s
        self._peak = _peak_token(_model_folder(path))

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {"CPUExecutionProvider": {}}

    def get_inputs(self) -> list[FakeIO]:
        return self._inputs

    def get_outputs(self) -> list[FakeIO]:
        return self._outputs

    def run(self, output_names: list[str] | None, feeds: dict[str, np.ndarray], *_: Any) -> list[np.ndarray]:
        sizes: dict[str, int] = {}
        for io in self._inputs:
            if io.name in feeds:
                for axis, size in zip(io.shape, feeds[io.name].shape, strict=False):
                    if isinstance(axis, str):
                        sizes.setdefault(axis, int(size))
        if self._service_s:
            time.sleep(self._service_s)
        wanted = output_names or [io.name for io in self._outputs]
        by_name = {io.name: io for io in self._outputs}
        return [self._output(by_name[name], sizes) for name in wanted]

    def _output(self, io: FakeIO, sizes: dict[str, int]) -> np.ndarray:
        shape = [axis if isinstance(axis, int) else sizes.get(axis, 1) for axis in io.shape]
        array = np.zeros(shape, dtype=io.dtype)
        if io.name == "logits" and self._peak is not None and shape and shape[-1] > self._peak:
            array[..., self._peak] = 10.0
        return array


def install() -> None:
    """Make every ONNX Runtime session the service opens a ``FakeSession`` (FAKE_SERVICE_MS per call)."""
    from service.engine import runtime

    service_s = float(os.environ.get("FAKE_SERVICE_MS", "0")) / 1000

    def create_session(path: Path, options: Any) -> Any:
        return FakeSession(Path(path), service_s)

    runtime.create_session = create_session  # type: ignore[assignment]
