"""Export a torch module to ONNX and prove the file computes what the module computes.

Every graph is exported with the dynamo exporter (opset 18, dynamic axes
inferred with Dim.AUTO), its input/output axes renamed to the names the
manifest documents, weights kept inside the .onnx file (no side file to
forget), then checked against torch on inputs of other shapes than the ones
it was traced with. The largest difference is returned for the manifest.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn
from torch.export import Dim

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

log = logging.getLogger(__name__)

OPSET = 18


class ExportError(RuntimeError):
    pass


@dataclass
class GraphSpec:
    """One ONNX graph: the module, how to trace it, and what its axes are called."""

    file: str
    module: nn.Module
    example_args: tuple[Any, ...]
    input_axes: dict[str, list[str | int]]  # input name -> axis names (ints are fixed sizes), in call order
    output_axes: dict[str, list[str | int]]  # output name -> axis names, in return order
    dynamic_shapes: tuple[Any, ...]
    parity_inputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    tolerance: float = 1e-3  # absolute, on logits of order 1-10; the measured figure goes in the manifest


def auto_dims(*axes: Sequence[int]) -> dict[int, Any]:
    """{axis: Dim.AUTO} for each given axis: torch.export finds the relations between them."""
    return {axis: Dim.AUTO for group in axes for axis in group}


def export_graph(spec: GraphSpec, model_dir: Path) -> dict[str, Any]:
    """Export, rename axes, check parity; return the manifest's entry for this graph."""
    path = model_dir / spec.file
    module = spec.module.eval()
    input_names = list(spec.input_axes)
    output_names = list(spec.output_axes)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            spec.example_args,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=spec.dynamic_shapes,
            dynamo=True,
            opset_version=OPSET,
            external_data=False,
            verbose=False,
        )
    _name_axes(path, spec.input_axes, spec.output_axes)
    diff = check_parity(path, module, input_names, spec.parity_inputs, spec.tolerance)
    log.info("exported %s (%.1f MB), max |torch - onnxruntime| = %.2e", path, path.stat().st_size / 1e6, diff)
    return {
        "file": spec.file,
        "inputs": [_io_entry(path, name, axes, True) for name, axes in spec.input_axes.items()],
        "outputs": [_io_entry(path, name, axes, False) for name, axes in spec.output_axes.items()],
        "parity_max_abs_diff": diff,
        "parity_tolerance": spec.tolerance,
    }


def _name_axes(
    path: Path, input_axes: dict[str, list[str | int]], output_axes: dict[str, list[str | int]]
) -> None:
    """Replace the exporter's symbols (s10, s70 + s89, ...) on graph inputs/outputs with the documented names."""
    model = onnx.load(str(path))
    for values, axes in ((model.graph.input, input_axes), (model.graph.output, output_axes)):
        for value in values:
            names = axes[value.name]
            dims = value.type.tensor_type.shape.dim
            assert len(dims) == len(names), f"{value.name}: graph has {len(dims)} axes, manifest {len(names)}"
            for dim, name in zip(dims, names, strict=True):
                if isinstance(name, str):
                    dim.dim_param = name
                elif dim.HasField("dim_value") and dim.dim_value != name:
                    raise ExportError(f"{value.name}: axis is {dim.dim_value}, expected {name}")
    onnx.save(model, str(path))


def _io_entry(path: Path, name: str, axes: list[str | int], is_input: bool) -> dict[str, Any]:
    model = onnx.load(str(path), load_external_data=False)
    values = model.graph.input if is_input else model.graph.output
    value = next(v for v in values if v.name == name)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    return {"name": name, "dtype": np.dtype(dtype).name, "shape": axes}


def check_parity(
    path: Path,
    module: nn.Module,
    input_names: list[str],
    feeds: list[dict[str, np.ndarray]],
    tolerance: float,
) -> float:
    """Max |torch - ONNX Runtime| over every output of every feed; raises if above tolerance."""
    import onnxruntime as ort

    assert feeds, f"{path.name}: no parity inputs given"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for feed in feeds:
        got = session.run(None, feed)
        with torch.no_grad():
            expected = module(*[torch.from_numpy(feed[name]) for name in input_names])
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        assert len(got) == len(expected), f"{path.name}: {len(got)} outputs, torch gave {len(expected)}"
        for g, e in zip(got, expected, strict=True):
            e = e.numpy()
            if g.shape != e.shape:
                raise ExportError(f"{path.name}: output shape {g.shape} != torch {e.shape}")
            if g.size:
                worst = max(worst, float(np.abs(g - e).max()))
    if worst > tolerance:
        raise ExportError(f"{path.name}: ONNX Runtime differs from torch by {worst:.2e} > {tolerance:.0e}")
    return worst
