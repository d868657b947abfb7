"""The graph specs of an imported checkpoint: the house's signatures (``recipes/signatures.py``) over its wrappers.

``graphs(checkpoint, model, seed)`` returns what ``onnx_export.export_graph`` exports and checks
against torch, per graph role, and ``attention_graph`` the ``attention.onnx`` spec where the family
has maps (BERT family, ViT: self-attention; Marian: cross-attention; not GPT-2, the embedder nor the
reranker, as for the house's own models).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..attention_graphs import FILE as ATTENTION_FILE
from ..attention_graphs import OUTPUT as ATTENTION_OUTPUT
from ..attention_graphs import TOLERANCE as ATTENTION_TOLERANCE
from ..onnx_export import GraphSpec, auto_dims
from ..recipes.signatures import BERT_INPUTS, DECODER_TOKEN_AXES, bert_feed, past_names
from . import wrappers
from .checkpoint import Checkpoint

# The head's outputs, named as the house names them, and the HF output attribute each comes from.
HEAD_OUTPUTS = {
    "text-classification": {"logits": "logits"},
    "rerank": {"logits": "logits"},  # a cross-encoder: one logit per (query, document) pair
    "token-classification": {"logits": "logits"},
    "question-answering": {"start_logits": "start_logits", "end_logits": "end_logits"},
}
# The heads whose pipelines serve attention maps (as the house's: not the embedder nor the reranker)
ATTENTION_TASKS = ("text-classification", "token-classification", "question-answering")


def _bert_inputs(checkpoint: Checkpoint) -> list[str]:
    return BERT_INPUTS if checkpoint.segments else BERT_INPUTS[:2]


def _encoder_spec(
    checkpoint: Checkpoint, module: nn.Module, outputs: dict[str, list[str | int]], seed: int, file: str
) -> GraphSpec:
    rng = np.random.default_rng(seed)
    names = _bert_inputs(checkpoint)
    vocab = checkpoint.vocab_size

    def feed(batch: int, length: int) -> dict[str, np.ndarray]:
        full = bert_feed(rng, vocab, batch, length)
        return {k: full[k] for k in names}

    example = feed(2, 9)
    return GraphSpec(
        file=file,
        module=module,
        example_args=tuple(torch.from_numpy(example[k]) for k in names),
        input_axes={k: ["batch", "sequence"] for k in names},
        output_axes=outputs,
        dynamic_shapes=tuple(auto_dims([0, 1]) for _ in names),
        parity_inputs=[feed(1, 12), feed(4, 7)],
        tolerance=1e-4,
    )


def _decoder_feed(
    rng: np.random.Generator,
    vocab: int,
    heads: int,
    head_dim: int,
    layers: int,
    batch: int,
    new: int,
    past: int,
    left_pad: int = 0,
) -> dict[str, np.ndarray]:
    """GPT-2's inputs: optional left padding (in the past too), positions that skip it."""
    mask = np.ones((batch, past + new), dtype=np.int64)
    mask[0, :left_pad] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, past:]
    feeds = {
        "input_ids": rng.integers(0, vocab, (batch, new), dtype=np.int64),
        "attention_mask": mask,
        "position_ids": positions.astype(np.int64),
    }
    for name in past_names(layers, "past"):
        feeds[name] = rng.standard_normal((batch, heads, past, head_dim)).astype(np.float32)
    return feeds


def _causal_lm(checkpoint: Checkpoint, model: nn.Module, seed: int) -> dict[str, GraphSpec]:
    rng = np.random.default_rng(seed)
    n, h, dh, vocab = checkpoint.num_layers, checkpoint.num_heads, checkpoint.head_dim, checkpoint.vocab_size
    example = _decoder_feed(rng, vocab, h, dh, n, 2, 3, 4)
    names = ["input_ids", "attention_mask", "position_ids", *past_names(n, "past")]
    return {
        "model": GraphSpec(
            file="model.onnx",
            module=wrappers.CausalLMWithCache(model, n),
            example_args=tuple(torch.from_numpy(example[k]) for k in names),
            input_axes={
                **DECODER_TOKEN_AXES,
                **{k: ["batch", h, "past_sequence", dh] for k in names[3:]},
            },
            output_axes={
                "logits": ["batch", "sequence", vocab],
                **{k: ["batch", h, "total_sequence", dh] for k in past_names(n, "present")},
            },
            dynamic_shapes=(
                auto_dims([0, 1]),
                auto_dims([0, 1]),
                auto_dims([0, 1]),
                tuple(auto_dims([0, 2]) for _ in range(2 * n)),
            ),
            parity_inputs=[
                _decoder_feed(rng, vocab, h, dh, n, 1, 5, 0),  # prefill with an empty past
                _decoder_feed(rng, vocab, h, dh, n, 3, 1, 6, left_pad=2),  # a step, a left-padded row
                _decoder_feed(rng, vocab, h, dh, n, 2, 4, 3),
            ],
            tolerance=1e-4,
        )
    }


def _seq2seq(checkpoint: Checkpoint, model: nn.Module, seed: int) -> dict[str, GraphSpec]:
    rng = np.random.default_rng(seed)
    n, h, dh, vocab = checkpoint.num_layers, checkpoint.num_heads, checkpoint.head_dim, checkpoint.vocab_size
    cross_names = [f"cross_{kind}.{i}" for i in range(n) for kind in ("key", "value")]

    def encoder_feed(batch: int, length: int, pad: int = 0) -> dict[str, np.ndarray]:
        mask = np.ones((batch, length), dtype=np.int64)
        mask[0, length - pad :] = 0
        return {"input_ids": rng.integers(0, vocab, (batch, length)), "attention_mask": mask}

    def decoder_feed(batch: int, new: int, past: int, src: int) -> dict[str, np.ndarray]:
        feed = {
            "input_ids": rng.integers(0, vocab, (batch, new)),
            "attention_mask": np.ones((batch, past + new), dtype=np.int64),
            "position_ids": np.tile(np.arange(past, past + new), (batch, 1)),
            "encoder_attention_mask": encoder_feed(batch, src, pad=1)["attention_mask"],
        }
        for name in cross_names:
            feed[name] = rng.standard_normal((batch, h, src, dh)).astype(np.float32)
        for name in past_names(n, "past"):
            feed[name] = rng.standard_normal((batch, h, past, dh)).astype(np.float32)
        return feed

    enc_example = encoder_feed(2, 5)
    dec_example = decoder_feed(2, 3, 4, 5)
    dec_names = [
        "input_ids",
        "attention_mask",
        "position_ids",
        "encoder_attention_mask",
        *cross_names,
        *past_names(n, "past"),
    ]
    kv_axes: list[str | int] = ["batch", h, "source_sequence", dh]
    return {
        "encoder": GraphSpec(
            file="encoder.onnx",
            module=wrappers.Seq2SeqEncoder(model),
            example_args=(
                torch.from_numpy(enc_example["input_ids"]),
                torch.from_numpy(enc_example["attention_mask"]),
            ),
            input_axes={
                "input_ids": ["batch", "source_sequence"],
                "attention_mask": ["batch", "source_sequence"],
            },
            output_axes={name: kv_axes for name in cross_names},
            dynamic_shapes=(auto_dims([0, 1]), auto_dims([0, 1])),
            parity_inputs=[encoder_feed(1, 7), encoder_feed(3, 4, pad=2)],
            tolerance=1e-4,
        ),
        "decoder": GraphSpec(
            file="decoder.onnx",
            module=wrappers.Seq2SeqDecoder(model, n),
            example_args=tuple(torch.from_numpy(dec_example[k]) for k in dec_names),
            input_axes={
                **DECODER_TOKEN_AXES,
                "encoder_attention_mask": ["batch", "source_sequence"],
                **{name: kv_axes for name in cross_names},
                **{name: ["batch", h, "past_sequence", dh] for name in past_names(n, "past")},
            },
            output_axes={
                "logits": ["batch", "sequence", vocab],
                **{name: ["batch", h, "total_sequence", dh] for name in past_names(n, "present")},
            },
            dynamic_shapes=(
                auto_dims([0, 1]),
                auto_dims([0, 1]),
                auto_dims([0, 1]),
                auto_dims([0, 1]),
                tuple(auto_dims([0, 2]) for _ in range(4 * n)),
            ),
            parity_inputs=[decoder_feed(1, 1, 0, 6), decoder_feed(4, 1, 5, 3), decoder_feed(2, 4, 2, 5)],
            tolerance=1e-4,
        ),
    }


def _image(
    checkpoint: Checkpoint, module: nn.Module, outputs: dict[str, list[str | int]], seed: int, file: str
) -> GraphSpec:
    rng = np.random.default_rng(seed)
    channels, size = checkpoint.channels, checkpoint.image_size

    def feed(n: int) -> dict[str, np.ndarray]:
        return {"pixel_values": rng.standard_normal((n, channels, size, size)).astype(np.float32)}

    return GraphSpec(
        file=file,
        module=module,
        example_args=(torch.from_numpy(feed(2)["pixel_values"]),),
        input_axes={"pixel_values": ["batch", channels, size, size]},
        output_axes=outputs,
        dynamic_shapes=(auto_dims([0]),),
        parity_inputs=[feed(1), feed(3)],
        tolerance=1e-4,
    )


def graphs(checkpoint: Checkpoint, model: nn.Module, seed: int) -> dict[str, GraphSpec]:
    """Every graph role of the checkpoint's task, over its ``transformers`` model in eval mode."""
    task = checkpoint.task
    labels = len(checkpoint.labels or [])
    if task in HEAD_OUTPUTS:
        axes: dict[str, dict[str, list[str | int]]] = {
            "text-classification": {"logits": ["batch", labels]},
            "rerank": {"logits": ["batch", 1]},
            "token-classification": {"logits": ["batch", "sequence", labels]},
            "question-answering": {
                "start_logits": ["batch", "sequence"],
                "end_logits": ["batch", "sequence"],
            },
        }
        head = wrappers.EncoderHead(model, tuple(HEAD_OUTPUTS[task].values()), checkpoint.segments)
        return {"model": _encoder_spec(checkpoint, head, axes[task], seed, "model.onnx")}
    if task == "feature-extraction":
        dims = checkpoint.hidden_size
        pooled = wrappers.MeanPooledEmbedding(model, checkpoint.segments)
        outputs: dict[str, list[str | int]] = {
            "sentence_embedding": ["batch", dims],
            "mean_pooled": ["batch", dims],
        }
        return {"model": _encoder_spec(checkpoint, pooled, outputs, seed, "model.onnx")}
    if task == "text-generation":
        return _causal_lm(checkpoint, model, seed)
    if task == "translation":
        return _seq2seq(checkpoint, model, seed)
    assert task == "image-classification", f"no graphs for task {task}"
    logits = wrappers.ImageClassifierLogits(model)
    return {"model": _image(checkpoint, logits, {"logits": ["batch", labels]}, seed, "model.onnx")}


def attention_graph(checkpoint: Checkpoint, model: nn.Module, seed: int) -> tuple[GraphSpec, str] | None:
    """``attention.onnx`` and its kind ("self" / "cross"), or None where the house serves no maps."""
    names = [ATTENTION_OUTPUT.format(i=i) for i in range(checkpoint.num_layers)]
    h = checkpoint.num_heads
    task = checkpoint.task
    if task in ATTENTION_TASKS:
        module = wrappers.EncoderAttentions(model, checkpoint.segments)
        outputs: dict[str, list[str | int]] = {n: ["batch", h, "sequence", "sequence"] for n in names}
        spec = _encoder_spec(checkpoint, module, outputs, seed + 1, ATTENTION_FILE)
        spec.tolerance = ATTENTION_TOLERANCE
        return spec, "self"
    if task == "image-classification":
        tokens = checkpoint.num_patches + 1
        image_maps = wrappers.ImageAttentions(model)
        outputs = {n: ["batch", h, tokens, tokens] for n in names}
        spec = _image(checkpoint, image_maps, outputs, seed + 1, ATTENTION_FILE)
        spec.tolerance = ATTENTION_TOLERANCE
        return spec, "self"
    if task == "translation":
        rng = np.random.default_rng(seed + 1)
        vocab = checkpoint.vocab_size

        def feed(batch: int, src: int, tgt: int, pad: int = 0) -> dict[str, np.ndarray]:
            mask = np.ones((batch, src), dtype=np.int64)
            mask[0, src - pad :] = 0
            return {
                "input_ids": rng.integers(0, vocab, (batch, src)),
                "attention_mask": mask,
                "decoder_input_ids": rng.integers(0, vocab, (batch, tgt)),
            }

        example = feed(2, 7, 5)
        spec = GraphSpec(
            file=ATTENTION_FILE,
            module=wrappers.CrossAttentions(model),
            example_args=tuple(torch.from_numpy(v) for v in example.values()),
            input_axes={
                "input_ids": ["batch", "source_sequence"],
                "attention_mask": ["batch", "source_sequence"],
                "decoder_input_ids": ["batch", "target_sequence"],
            },
            output_axes={n: ["batch", h, "target_sequence", "source_sequence"] for n in names},
            dynamic_shapes=(auto_dims([0, 1]), auto_dims([0, 1]), auto_dims([0, 1])),
            parity_inputs=[feed(1, 9, 4), feed(3, 4, 6, pad=2)],
            tolerance=ATTENTION_TOLERANCE,
        )
        return spec, "cross"
    return None
