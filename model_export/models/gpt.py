"""GPT: a decoder-only Transformer language model (causal self-attention, learned positions, tied embeddings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .layers import DecoderLayer, KeyValue, LearnedPositionalEmbedding, decoder_self_mask, init_weights


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    d_ff: int = 1024
    max_len: int = 256
    dropout: float = 0.1


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(config.d_model, config.num_heads, config.d_ff, config.dropout, norm_first=True)
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(init_weights)
        self.lm_head.weight = self.tok_emb.weight  # weight tying: the embedding's N(0, 0.02) init stands

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past: list[KeyValue] | None = None,
    ) -> tuple[torch.Tensor, list[KeyValue]]:
        """input_ids (B, T); attention_mask (B, P + T) over past and new tokens; position_ids (B, T).

        Returns logits (B, T, V) and the present keys/values per layer, each (B, H, P + T, Dh).
        """
        b, t = input_ids.shape
        past_len = past[0][0].shape[2] if past is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones(b, past_len + t, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + t, device=input_ids.device).expand(b, t)
        mask = decoder_self_mask(attention_mask, t)  # (B, 1, T, P + T)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(position_ids))  # (B, T, D)
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, mask, past=past[i] if past is not None else None)
            presents.append(present)
        return self.lm_head(self.norm(x)), presents
