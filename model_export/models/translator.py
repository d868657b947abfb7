"""The encoder-decoder Transformer (Vaswani et al. 2017) for English to German.

Sinusoidal positions, a shared (joint BPE) embedding for source, target and
the output projection, pre-LN layers. The decoder's cross-attention keys and
values are computed once from the encoder output (`cross_kv`), which is what
the exported encoder graph returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .layers import (
    DecoderLayer,
    EncoderLayer,
    KeyValue,
    SinusoidalPositionalEncoding,
    decoder_self_mask,
    init_weights,
    padding_mask,
)


@dataclass(frozen=True)
class TranslatorConfig:
    vocab_size: int
    d_model: int = 256
    num_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    max_len: int = 256
    pad_id: int = 0


class EncoderDecoder(nn.Module):
    """Encoder, decoder and generator over one shared (tied) embedding: the Annotated Transformer's model."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        self.embed_scale = math.sqrt(d)
        self.pos = SinusoidalPositionalEncoding(d, config.max_len)
        self.drop = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d, config.num_heads, config.d_ff, config.dropout, norm_first=True)
            for _ in range(config.encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(d)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(
                d, config.num_heads, config.d_ff, config.dropout, norm_first=True, cross_attention=True
            )
            for _ in range(config.decoder_layers)
        )
        self.decoder_norm = nn.LayerNorm(d)
        self.generator = nn.Linear(d, config.vocab_size, bias=False)
        self.apply(init_weights)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d**-0.5)
        self.generator.weight = self.embed.weight  # tied input/output embeddings

    def _embed(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids) * self.embed_scale + self.pos(position_ids))  # (B, T, D)

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """src_ids, src_mask (B, S) -> memory (B, S, D)."""
        b, s = src_ids.shape
        positions = torch.arange(s, device=src_ids.device).expand(b, s)
        x = self._embed(src_ids, positions)
        mask = padding_mask(src_mask)  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x)

    def cross_kv(self, memory: torch.Tensor) -> list[KeyValue]:
        """The encoder output projected to keys/values for every decoder layer, each (B, H, S, Dh)."""
        kv = []
        for layer in self.decoder_layers:
            assert isinstance(layer, DecoderLayer) and layer.cross_attn is not None
            kv.append(layer.cross_attn.project_kv(memory))
        return kv

    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        src_mask: torch.Tensor,
        cross: list[KeyValue],
        past: list[KeyValue] | None = None,
    ) -> tuple[torch.Tensor, list[KeyValue]]:
        """One decoder pass over T new target tokens: logits (B, T, V) and presents (B, H, P + T, Dh)."""
        t = input_ids.shape[1]
        self_mask = decoder_self_mask(attention_mask, t)  # (B, 1, T, P + T)
        memory_mask = padding_mask(src_mask)  # (B, 1, 1, S)
        x = self._embed(input_ids, position_ids)
        presents = []
        for i, layer in enumerate(self.decoder_layers):
            x, present = layer(
                x,
                self_mask,
                past=past[i] if past is not None else None,
                memory_kv=cross[i],
                memory_mask=memory_mask,
            )
            presents.append(present)
        return self.generator(self.decoder_norm(x)), presents

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits (B, T, V) for every target position at once."""
        return self.generator(self.decoder_states(src_ids, src_mask, tgt_ids))

    def decoder_states(
        self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_ids: torch.Tensor
    ) -> torch.Tensor:
        """Teacher forcing up to the final norm: (B, T, D). Training projects only the real positions to the vocabulary."""
        memory = self.encode(src_ids, src_mask)
        b, t = tgt_ids.shape
        tgt_mask = (tgt_ids != self.config.pad_id).long()
        # Right padding: positions are plain 0..T-1, and causality keeps padding out of real tokens.
        tgt_mask[:, 0] = 1
        positions = torch.arange(t, device=tgt_ids.device).expand(b, t)
        x = self._embed(tgt_ids, positions)
        self_mask, memory_mask = decoder_self_mask(tgt_mask, t), padding_mask(src_mask)
        for layer, kv in zip(self.decoder_layers, self.cross_kv(memory), strict=True):
            x, _ = layer(x, self_mask, memory_kv=kv, memory_mask=memory_mask)
        return self.decoder_norm(x)
