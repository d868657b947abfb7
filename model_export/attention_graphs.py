"""The attention-map graph: one extra fp32, unfused ONNX file per model that outputs attention probabilities.

The served graphs (and their fused / int8 / fp16 variants) never compute more than the answer. For
the playground and for anyone inspecting a model, ``attention.onnx`` runs the same weights with
``MultiHeadAttention.record_weights`` on and returns every layer's probabilities, one output per
layer, ``attention.{i}`` (batch, heads, queries, keys):

- translator: source ids + target ids (teacher-forced) -> each decoder layer's cross-attention,
  queries = target positions, keys = source tokens;
- bert-classifier, bert-tagger, bert-qa: token ids (+ mask, segments) -> each encoder layer's
  self-attention over the tokens;
- vit: pixels -> each layer's self-attention over [CLS] + patches (row 0 is [CLS] to patches).

It is exported and parity-checked against torch exactly like the other graphs (``onnx_export``) and
recorded in the manifest's ``attention_maps`` section, not in ``graphs``: the variants stage never
sees it, and a folder without it serves as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .models.bert import BertEncoder
from .models.layers import MultiHeadAttention
from .models.translator import EncoderDecoder
from .models.vit import ViT
from .onnx_export import GraphSpec, auto_dims, export_graph
from .recipes.common import Trained
from .recipes.signatures import BERT_INPUTS, bert_feed

FILE = "attention.onnx"
OUTPUT = "attention.{i}"
# Probabilities are in [0, 1]: 1e-4 is a tenth of the 1e-3 the logits graphs allow, and far below
# the 4-decimal rounding of the API's answer.
TOLERANCE = 1e-4
BERT_TASKS = ("text-classification", "token-classification", "question-answering")


@contextmanager
def recording(attentions: list[MultiHeadAttention]) -> Iterator[None]:
    """Turn ``record_weights`` on for these attention modules, and off again (the class default) after."""
    for attention in attentions:
        attention.record_weights = True
    try:
        yield
    finally:
        for attention in attentions:
            del attention.record_weights
            attention.last_weights = None


def attentions(layers: nn.ModuleList, name: str) -> list[MultiHeadAttention]:
    """Every layer's ``name`` attention module (``self_attn`` / ``cross_attn``), in layer order."""
    found = [a for layer in layers if isinstance(a := getattr(layer, name), MultiHeadAttention)]
    assert len(found) == len(layers), f"a layer without {name}"
    return found


class RecordedAttention(nn.Module):
    """Runs ``forward`` of the wrapped model's attention path and returns each recorded layer's probabilities."""

    def __init__(self, attentions: list[MultiHeadAttention]) -> None:
        super().__init__()
        self.attentions = attentions  # a plain list: the modules belong to the wrapped model

    def collect(self) -> tuple[torch.Tensor, ...]:
        weights = [a.last_weights for a in self.attentions]
        assert all(w is not None for w in weights), "an attention layer recorded nothing"
        return tuple(w for w in weights if w is not None)


class TranslatorCrossAttention(RecordedAttention):
    """(source ids, source mask, decoder input ids) -> every decoder layer's cross-attention (B, H, T, S)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__(attentions(model.decoder_layers, "cross_attn"))
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):  # type: ignore[no-untyped-def]
        self.model.decoder_states(input_ids, attention_mask, decoder_input_ids)
        return self.collect()


class BertSelfAttention(RecordedAttention):
    """(input_ids, attention_mask, token_type_ids) -> every encoder layer's self-attention (B, H, S, S)."""

    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__(attentions(encoder.layers, "self_attn"))
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
        self.encoder(input_ids, attention_mask, token_type_ids)
        return self.collect()


class VitSelfAttention(RecordedAttention):
    """pixel_values -> every layer's self-attention over [CLS] + patches (B, H, N + 1, N + 1)."""

    def __init__(self, model: ViT) -> None:
        super().__init__(attentions(model.layers, "self_attn"))
        self.model = model

    def forward(self, pixel_values):  # type: ignore[no-untyped-def]
        self.model(pixel_values)
        return self.collect()


def attention_module(trained: Trained) -> tuple[RecordedAttention, str] | None:
    """The recording wrapper for this model and its kind ("cross" / "self"), or None (no attention maps)."""
    model = trained.model
    if isinstance(model, EncoderDecoder):
        return TranslatorCrossAttention(model), "cross"
    if isinstance(model, ViT):
        return VitSelfAttention(model), "self"
    encoder = getattr(model, "encoder", None)
    if trained.manifest.get("task") in BERT_TASKS and isinstance(encoder, BertEncoder):
        return BertSelfAttention(encoder), "self"
    return None


def attention_spec(trained: Trained, seed: int) -> tuple[GraphSpec, str, int, int] | None:
    """The graph spec of ``attention.onnx`` for this model, its kind, layer count and head count."""
    found = attention_module(trained)
    if found is None:
        return None
    module, kind = found
    layers, heads = len(module.attentions), module.attentions[0].num_heads
    names = [OUTPUT.format(i=i) for i in range(layers)]
    rng = np.random.default_rng(seed + 1)
    model = trained.model
    if isinstance(model, EncoderDecoder):
        vocab = model.config.vocab_size

        def feed(batch: int, src: int, tgt: int, pad: int = 0) -> dict[str, np.ndarray]:
            mask = np.ones((batch, src), dtype=np.int64)
            mask[0, src - pad :] = 0
            return {
                "input_ids": rng.integers(3, vocab, (batch, src)),
                "attention_mask": mask,
                "decoder_input_ids": rng.integers(3, vocab, (batch, tgt)),
            }

        example = feed(2, 7, 5)
        spec = GraphSpec(
            file=FILE,
            module=module,
            example_args=tuple(torch.from_numpy(v) for v in example.values()),
            input_axes={
                "input_ids": ["batch", "source_sequence"],
                "attention_mask": ["batch", "source_sequence"],
                "decoder_input_ids": ["batch", "target_sequence"],
            },
            output_axes={n: ["batch", heads, "target_sequence", "source_sequence"] for n in names},
            dynamic_shapes=(auto_dims([0, 1]), auto_dims([0, 1]), auto_dims([0, 1])),
            parity_inputs=[feed(1, 9, 4), feed(3, 4, 6, pad=2)],
            tolerance=TOLERANCE,
        )
    elif isinstance(model, ViT):
        tokens = model.patch_embed.num_patches + 1
        size, channels = model.config.image_size, model.config.channels

        def pixels(n: int) -> dict[str, np.ndarray]:
            return {"pixel_values": rng.standard_normal((n, channels, size, size)).astype(np.float32)}

        spec = GraphSpec(
            file=FILE,
            module=module,
            example_args=(torch.from_numpy(pixels(2)["pixel_values"]),),
            input_axes={"pixel_values": ["batch", channels, size, size]},
            output_axes={n: ["batch", heads, tokens, tokens] for n in names},
            dynamic_shapes=(auto_dims([0]),),
            parity_inputs=[pixels(1), pixels(3)],
            tolerance=TOLERANCE,
        )
    else:
        assert trained.tokenizer is not None
        vocab = trained.tokenizer.get_vocab_size()
        example = bert_feed(rng, vocab, 2, 9)
        spec = GraphSpec(
            file=FILE,
            module=module,
            example_args=tuple(torch.from_numpy(example[k]) for k in BERT_INPUTS),
            input_axes={k: ["batch", "sequence"] for k in BERT_INPUTS},
            output_axes={n: ["batch", heads, "sequence", "sequence"] for n in names},
            dynamic_shapes=tuple(auto_dims([0, 1]) for _ in BERT_INPUTS),
            parity_inputs=[bert_feed(rng, vocab, 1, 12), bert_feed(rng, vocab, 3, 7)],
            tolerance=TOLERANCE,
        )
    return spec, kind, layers, heads


def export_attention_maps(trained: Trained, model_dir: Path, seed: int) -> dict[str, Any] | None:
    """Export ``attention.onnx`` into ``model_dir`` (checked against torch); the manifest's ``attention_maps``.

    None for models without attention maps (GPT, the sentence embedder).
    """
    found = attention_spec(trained, seed)
    if found is None:
        return None
    spec, kind, layers, heads = found
    assert isinstance(spec.module, RecordedAttention)
    with recording(spec.module.attentions):
        entry = export_graph(spec, model_dir)
    return {**entry, "kind": kind, "num_layers": layers, "num_heads": heads, "output": OUTPUT}
