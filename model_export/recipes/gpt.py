"""gpt: a byte-level BPE decoder-only LM on Tiny Shakespeare, exported as one KV-cached graph."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from ..data import load_tinyshakespeare
from ..models.gpt import GPT, GPTConfig
from ..onnx_export import GraphSpec, auto_dims
from ..profiles import GptRecipe
from ..tokenization import train_byte_level_bpe
from ..training import TrainResult
from . import probes
from .common import BuildContext, Trained, TrainingJob
from .signatures import DECODER_TOKEN_AXES, kv_cache_layout, past_names

EOS = "<|endoftext|>"


class GPTWithCache(nn.Module):
    """The exported signature: (input_ids, attention_mask, position_ids, *past) -> (logits, *present)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        logits, presents = self.model(input_ids, attention_mask, position_ids, pairs)
        return (logits, *[t for kv in presents for t in kv])


def cache_feeds(
    config: GPTConfig, batch: int, new: int, past: int, rng: np.random.Generator, left_pad: int = 0
) -> dict[str, np.ndarray]:
    """Random but well-formed inputs for parity checks: optional left padding, positions that skip it."""
    head_dim = config.d_model // config.num_heads
    mask = np.ones((batch, past + new), dtype=np.int64)
    mask[0, :left_pad] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, past:]
    feeds = {
        "input_ids": rng.integers(0, config.vocab_size, (batch, new), dtype=np.int64),
        "attention_mask": mask,
        "position_ids": positions.astype(np.int64),
    }
    for name in past_names(config.num_layers, "past"):
        feeds[name] = rng.standard_normal((batch, config.num_heads, past, head_dim)).astype(np.float32)
    return feeds


def prepare(ctx: BuildContext[GptRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    text = load_tinyshakespeare(ctx.data_dir, "train")[: recipe.train_chars]
    tokenizer = train_byte_level_bpe(text.splitlines(keepends=True), recipe.model.vocab_size, [EOS])
    ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.long)
    config = dataclasses.replace(recipe.model, vocab_size=tokenizer.get_vocab_size())
    model = GPT(config)
    seq_len, batch_size = recipe.seq_len, recipe.batch_size
    # Windows cover the positions the model serves (and evaluation scores): a position the training
    # never saw has an untrained embedding.
    assert seq_len <= config.max_len, f"seq_len {seq_len} exceeds the position table size {config.max_len}"

    def batches(seed: int) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        while True:
            starts = torch.randint(0, len(ids) - seq_len - 1, (batch_size,), generator=generator)
            yield torch.stack([ids[i : i + seq_len + 1] for i in starts.tolist()])  # (B, T + 1)

    def loss_fn(m: nn.Module, batch: torch.Tensor):  # type: ignore[no-untyped-def]
        logits, _ = m(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        return loss, batch.size(0), batch[:, 1:].numel()

    return TrainingJob(
        ctx,
        model,
        batches,
        loss_fn,
        "tokens",
        lambda r: _finish(ctx, model, tokenizer, len(text), len(ids), r),
        probes.gpt(ctx.name, recipe, ctx.data_dir, tokenizer, config.max_len),
    )


def _finish(
    ctx: BuildContext[GptRecipe],
    model: GPT,
    tokenizer: Tokenizer,
    train_chars: int,
    train_tokens: int,
    result: TrainResult,
) -> Trained:
    config = model.config
    eos_id = tokenizer.token_to_id(EOS)
    manifest = {
        "task": "text-generation",
        "architecture": "gpt",
        "description": "decoder-only Transformer LM, byte-level BPE, trained on Tiny Shakespeare",
        "config": dataclasses.asdict(config),
        "max_sequence_length": config.max_len,
        "special_tokens": {"eos": eos_id, "pad": eos_id},
        "kv_cache": kv_cache_layout(config.num_layers, config.num_heads, config.d_model // config.num_heads),
    }
    training = {
        "data": "tinyshakespeare/train.txt",
        "train_characters": train_chars,
        "train_tokens": train_tokens,
    }
    return Trained(ctx.name, model, tokenizer, manifest, training, result)


def graphs(trained: Trained, seed: int) -> dict[str, GraphSpec]:
    model = trained.model
    assert isinstance(model, GPT)
    config = model.config
    rng = np.random.default_rng(seed)
    n = config.num_layers
    example = cache_feeds(config, 2, 3, 4, rng)
    names = ["input_ids", "attention_mask", "position_ids", *past_names(n, "past")]
    graph = GraphSpec(
        file="model.onnx",
        module=GPTWithCache(model),
        example_args=tuple(torch.from_numpy(example[k]) for k in names),
        input_axes={
            **DECODER_TOKEN_AXES,
            **{
                k: ["batch", config.num_heads, "past_sequence", config.d_model // config.num_heads]
                for k in names[3:]
            },
        },
        output_axes={
            "logits": ["batch", "sequence", config.vocab_size],
            **{
                k: ["batch", config.num_heads, "total_sequence", config.d_model // config.num_heads]
                for k in past_names(n, "present")
            },
        },
        dynamic_shapes=(
            auto_dims([0, 1]),
            auto_dims([0, 1]),
            auto_dims([0, 1]),
            tuple(auto_dims([0, 2]) for _ in range(2 * n)),
        ),
        parity_inputs=[
            cache_feeds(config, 1, 5, 0, rng),  # prefill with an empty past
            cache_feeds(config, 3, 1, 6, rng, left_pad=2),  # one decoding step, left-padded row
            cache_feeds(config, 2, 4, 3, rng),
        ],
    )
    return {"model": graph}
