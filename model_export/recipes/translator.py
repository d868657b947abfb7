"""translator: the encoder-decoder Transformer on Multi30k EN->DE, exported as encoder + KV-cached decoder."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from ..data import load_multi30k
from ..models.translator import EncoderDecoder, TranslatorConfig
from ..onnx_export import GraphSpec, auto_dims
from ..profiles import TranslatorRecipe
from ..tokenization import train_byte_level_bpe
from ..training import TrainResult, infinite
from . import probes
from .common import BuildContext, Trained, TrainingJob
from .signatures import DECODER_TOKEN_AXES, kv_cache_layout, past_names

SPECIALS = ["<pad>", "<s>", "</s>"]
PAD, BOS, EOS = 0, 1, 2


class TranslatorEncoder(nn.Module):
    """(src_ids, src_mask) -> cross-attention keys/values for every decoder layer, computed once per request."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
        memory = self.model.encode(input_ids, attention_mask)
        return tuple(t for kv in self.model.cross_kv(memory) for t in kv)


class TranslatorDecoder(nn.Module):
    """(input_ids, attention_mask, position_ids, encoder_attention_mask, *cross, *past) -> (logits, *present)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model
        self.num_layers = model.config.decoder_layers

    def forward(self, input_ids, attention_mask, position_ids, encoder_attention_mask, *kv):  # type: ignore[no-untyped-def]
        n = self.num_layers
        cross = [(kv[2 * i], kv[2 * i + 1]) for i in range(n)]
        past = [(kv[2 * n + 2 * i], kv[2 * n + 2 * i + 1]) for i in range(n)]
        logits, presents = self.model.decode(
            input_ids, attention_mask, position_ids, encoder_attention_mask, cross, past
        )
        return (logits, *[t for pair in presents for t in pair])


def token_batches(
    pairs: list[tuple[list[int], list[int]]], batch_tokens: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One epoch of batches of similar-length pairs, each at most `batch_tokens` padded tokens per side."""
    rng = random.Random(seed)
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1]), rng.random()))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(len(pairs[i][0]), len(pairs[i][1]) + 1)
        if current and max(longest, length) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    for batch in batches:
        src = [pairs[i][0] for i in batch]
        tgt = [[BOS, *pairs[i][1], EOS] for i in batch]
        yield _pad(src), _pad([t[:-1] for t in tgt]), _pad([t[1:] for t in tgt])


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def prepare(ctx: BuildContext[TranslatorRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    raw = load_multi30k(ctx.data_dir, "train")[: recipe.train_pairs]
    tokenizer = train_byte_level_bpe([t for pair in raw for t in pair], recipe.model.vocab_size, SPECIALS)
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == [PAD, BOS, EOS], "special token ids moved"
    src_ids = [[*e.ids, EOS] for e in tokenizer.encode_batch([en for en, _ in raw])]
    tgt_ids = [e.ids for e in tokenizer.encode_batch([de for _, de in raw])]
    limit = recipe.model.max_len - 2
    pairs = [(a, b) for a, b in zip(src_ids, tgt_ids, strict=True) if len(a) <= limit and len(b) <= limit]
    config = dataclasses.replace(recipe.model, vocab_size=tokenizer.get_vocab_size(), pad_id=PAD)
    model = EncoderDecoder(config)

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        assert isinstance(m, EncoderDecoder)
        src, tgt_in, tgt_out = batch
        real = tgt_out != PAD  # a third of a batch can be padding: skip its vocabulary projection
        states = m.decoder_states(src, (src != PAD).long(), tgt_in)  # (B, T, D)
        logits = m.generator(states[real])  # (N_real, V)
        loss = F.cross_entropy(logits, tgt_out[real], label_smoothing=recipe.label_smoothing)
        return loss, len(src), int((tgt_out != PAD).sum())

    def batches(seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return infinite(lambda e: token_batches(pairs, recipe.batch_tokens, seed + e))

    return TrainingJob(
        ctx,
        model,
        batches,
        loss_fn,
        "target_tokens",
        lambda r: _finish(ctx, model, config, tokenizer, len(pairs), r),
        probes.translator(ctx.name, recipe, ctx.data_dir, tokenizer, (PAD, BOS, EOS)),
    )


def _finish(
    ctx: BuildContext[TranslatorRecipe],
    model: EncoderDecoder,
    config: TranslatorConfig,
    tokenizer: Tokenizer,
    train_pairs: int,
    result: TrainResult,
) -> Trained:
    limit = config.max_len - 2
    n, h, dh = config.decoder_layers, config.num_heads, config.d_model // config.num_heads
    manifest = {
        "task": "translation",
        "architecture": "encoder-decoder-transformer",
        "description": "Transformer (Vaswani 2017) EN->DE, joint byte-level BPE, trained on Multi30k",
        "source_language": "en",
        "target_language": "de",
        "config": dataclasses.asdict(config),
        "max_sequence_length": config.max_len,
        "max_source_length": limit + 1,
        "max_target_length": limit + 1,
        "special_tokens": {"pad": PAD, "bos": BOS, "eos": EOS},
        "source_suffix": [EOS],
        "kv_cache": kv_cache_layout(n, h, dh),
        "cross_attention": {
            "num_layers": n,
            "axes": ["batch", "num_heads", "source_sequence", "head_dim"],
            "key": "cross_key.{i}",
            "value": "cross_value.{i}",
            "mask_input": "encoder_attention_mask",
        },
    }
    training = {
        "data": "multi30k/train.{en,de}.gz",
        "train_pairs": train_pairs,
        "label_smoothing": ctx.recipe.label_smoothing,
        "batch_tokens": ctx.recipe.batch_tokens,
    }
    return Trained(ctx.name, model, tokenizer, manifest, training, result)


def graphs(trained: Trained, seed: int) -> dict[str, GraphSpec]:
    model = trained.model
    assert isinstance(model, EncoderDecoder)
    config = model.config
    n, h, dh = config.decoder_layers, config.num_heads, config.d_model // config.num_heads
    rng = np.random.default_rng(seed)
    cross_names = [f"cross_{kind}.{i}" for i in range(n) for kind in ("key", "value")]

    def encoder_feed(batch: int, length: int, pad: int = 0) -> dict[str, np.ndarray]:
        mask = np.ones((batch, length), dtype=np.int64)
        mask[0, length - pad :] = 0
        return {"input_ids": rng.integers(3, config.vocab_size, (batch, length)), "attention_mask": mask}

    def decoder_feed(batch: int, new: int, past: int, src: int) -> dict[str, np.ndarray]:
        feed = {
            "input_ids": rng.integers(3, config.vocab_size, (batch, new)),
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
            module=TranslatorEncoder(model),
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
        ),
        "decoder": GraphSpec(
            file="decoder.onnx",
            module=TranslatorDecoder(model),
            example_args=tuple(torch.from_numpy(dec_example[k]) for k in dec_names),
            input_axes={
                **DECODER_TOKEN_AXES,
                "encoder_attention_mask": ["batch", "source_sequence"],
                **{name: kv_axes for name in cross_names},
                **{name: ["batch", h, "past_sequence", dh] for name in past_names(n, "past")},
            },
            output_axes={
                "logits": ["batch", "sequence", config.vocab_size],
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
        ),
    }
