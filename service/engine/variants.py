"""Which copy of a model's graphs to serve: the fp32 reference, or an optimized variant, by device.

The export writes the reference graphs (fp32, exactly as exported, parity-checked against torch) and,
with ``python -m model_export variants``, optimized copies recorded in the manifest's ``variants``:
``fused`` (fp32, attention / LayerNorm / GELU fused), ``int8`` (per-row activation scales, for CPUs) and
``fp16`` (for GPUs), each with its validation metrics and whether it passed the accuracy rule
(``serve_by_default``; int8 must also have been faster than fused where it was built). With MODEL_VARIANT=auto the service serves, on each device, the first of its
preference order that lists the device and passed; otherwise the reference. A named MODEL_VARIANT is
served where the model has it (whatever the rule said: the operator asked), else the reference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from .manifest import Manifest, Precision

log = logging.getLogger(__name__)

VariantChoice = Literal["auto", "reference", "fused", "int8", "fp16"]
ServingDevice = Literal["cpu", "cuda"]
REFERENCE = "reference"
# Fastest first: int8 matmuls on CPU, fp16 tensor cores on GPU, fused fp32 on either.
PREFERENCE: dict[ServingDevice, tuple[str, ...]] = {"cpu": ("int8", "fused"), "cuda": ("fp16", "fused")}


@dataclass(frozen=True)
class ServedVariant:
    """The graphs a model serves: ``name`` is "reference" or a manifest variant's name."""

    name: str
    precision: Precision
    files: dict[str, str]  # graph name -> file
    reason: str  # why this one, in words (logged at load)
    inplace_decode: dict[str, str] = field(default_factory=dict)  # graph name -> in-place KV step file


def reference_of(manifest: Manifest, reason: str) -> ServedVariant:
    return ServedVariant(REFERENCE, "fp32", {g: e.file for g, e in manifest.graphs.items()}, reason)


def choose_variant(
    manifest: Manifest, device: ServingDevice, requested: VariantChoice = "auto"
) -> ServedVariant:
    """The variant to serve on ``device`` (see the module docstring)."""
    if requested == REFERENCE:
        return reference_of(manifest, "MODEL_VARIANT=reference")
    if requested != "auto":
        variant = manifest.variants.get(requested)
        if variant is None:
            return reference_of(
                manifest, f"MODEL_VARIANT={requested}, but the model has no {requested} variant"
            )
        if device not in variant.devices:
            return reference_of(
                manifest,
                f"MODEL_VARIANT={requested}, but that variant runs on {'/'.join(variant.devices)} only",
            )
        return ServedVariant(
            requested,
            variant.precision,
            dict(variant.graphs),
            f"MODEL_VARIANT={requested}",
            dict(variant.inplace_decode),
        )
    for name in PREFERENCE[device]:
        variant = manifest.variants.get(name)
        if variant is not None and device in variant.devices and variant.serve_by_default:
            return ServedVariant(
                name,
                variant.precision,
                dict(variant.graphs),
                variant.reason or "passed the rule",
                dict(variant.inplace_decode),
            )
    held_back = [
        f"{name}: {v.reason or 'not served by default'}"
        for name, v in manifest.variants.items()
        if device in v.devices and not v.serve_by_default
    ]
    why = "; ".join(held_back) if held_back else f"no variant for {device}"
    return reference_of(manifest, why)
