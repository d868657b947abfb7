"""Attention maps: the exported attention graph against torch, and return_attention through the real API.

Numbers: every map is compared with the torch module's own probabilities (``MultiHeadAttention``
with ``record_weights`` on), rebuilt from the tiny models' trained checkpoints. The ONNX graph is
fp32 like torch: they agree to ~1e-7 (export records it), so 1e-5 leaves room for other CPUs. The
API rounds to 5 decimals (at most 5e-6 off per weight), so there 2e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model_export.attention_graphs import attention_module, attention_spec, recording
from model_export.builders.common import Trained
from service.engine.manifest import Manifest

WITH_MAPS = ("translator", "bert-classifier", "bert-qa", "bert-tagger", "vit")
WITHOUT_MAPS = ("gpt", "bert-embedder")


def torch_maps(trained: Trained, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every layer's attention probabilities from the torch module itself, weights recording on."""
    found = attention_module(trained)
    assert found is not None
    module, _ = found
    with recording(module.attentions), torch.no_grad():
        outputs = module.eval()(*[torch.from_numpy(v) for v in feed.values()])
    return [o.numpy() for o in outputs]


def onnx_maps(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


@pytest.mark.parametrize("name", WITH_MAPS)
def test_the_attention_graph_matches_torch_and_rows_sum_to_one(tiny_models: Path, name: str) -> None:
    trained = Trained.load(tiny_models / ".work" / name / "trained.pt")
    found = attention_spec(trained, seed=777)  # other inputs than the export's parity check
    assert found is not None
    spec, kind, layers, heads = found
    manifest = Manifest.model_validate_json((tiny_models / name / "manifest.json").read_text())
    maps = manifest.attention_maps
    assert maps is not None and maps.file == "attention.onnx" and maps.file in manifest.files
    assert (maps.kind, maps.num_layers, maps.num_heads) == (kind, layers, heads)
    assert [t.name for t in maps.inputs] == list(spec.input_axes)
    for feed in spec.parity_inputs:
        got = onnx_maps(tiny_models / name / maps.file, feed)
        expected = torch_maps(trained, feed)
        assert len(got) == len(expected) == layers
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and g.shape[1] == heads
            assert float(np.abs(g - e).max()) < 1e-5
            np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-5)
            assert (g >= 0).all()


def test_masked_source_tokens_get_no_weight(tiny_models: Path) -> None:
    trained = Trained.load(tiny_models / ".work" / "translator" / "trained.pt")
    feed = {
        "input_ids": np.array([[5, 6, 7, 8, 0, 0]], dtype=np.int64),
        "attention_mask": np.array([[1, 1, 1, 1, 0, 0]], dtype=np.int64),
        "decoder_input_ids": np.array([[1, 9, 10]], dtype=np.int64),
    }
    for layer in onnx_maps(tiny_models / "translator" / "attention.onnx", feed):
        assert float(layer[..., 4:].max()) < 1e-6


@pytest.mark.parametrize("name", WITHOUT_MAPS)
def test_models_without_maps_have_no_section(tiny_models: Path, name: str) -> None:
    manifest = json.loads((tiny_models / name / "manifest.json").read_text())
    assert "attention_maps" not in manifest
    assert not (tiny_models / name / "attention.onnx").exists()


@pytest.mark.parametrize("name", WITH_MAPS)
def test_the_fast_path_graphs_have_no_attention_outputs(tiny_models: Path, name: str) -> None:
    """The served graphs (reference and every variant) output what they did before: no probabilities."""
    manifest = Manifest.model_validate_json((tiny_models / name / "manifest.json").read_text())
    files = [g.file for g in manifest.graphs.values()]
    files += [f for v in manifest.variants.values() for f in v.graphs.values()]
    assert "attention.onnx" not in files
    for file in files:
        outputs = [o.name for o in onnx.load(str(tiny_models / name / file), load_external_data=False).graph.output]
        assert not [o for o in outputs if o.startswith("attention")], (file, outputs)
    for graph in manifest.graphs.values():
        assert not [o.name for o in graph.outputs if o.name.startswith("attention")]


def test_recording_is_off_by_default_and_restored() -> None:
    from model_export.layers import MultiHeadAttention

    attention = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 3, 8)
    attention(x)
    assert attention.last_weights is None
    with recording([attention]):
        out, _ = attention(x)
        assert attention.last_weights is not None and attention.last_weights.shape == (1, 2, 3, 3)
    assert attention.record_weights is False and attention.last_weights is None
    plain, _ = attention(x)
    torch.testing.assert_close(out, plain)  # recording changes what is kept, not what is computed
