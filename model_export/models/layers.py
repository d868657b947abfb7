"""The shared Transformer pieces, written once and composed by every architecture.

Names follow the lecture (and the annotated transformer): scaled dot-product
attention, multi-head attention, positional encodings, position-wise
feed-forward, residual + LayerNorm sublayer connections, encoder and decoder
layers. Masks are boolean with True meaning "may attend".

Shape legend: B batch, T query length, S key length, P past length,
H heads, Dh head size, D model width.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

KeyValue = tuple[torch.Tensor, torch.Tensor]  # each (B, H, S, Dh)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gelu": F.gelu, "relu": F.relu}


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: nn.Module | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v, with masked scores pushed to the dtype's minimum.

    A finite minimum rather than -inf keeps a fully masked row (a padding
    query) finite: it averages the values instead of producing NaN, and real
    tokens never look at those rows.
    """
    weights = attention_probabilities(q, k, mask)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v  # (B, H, T, Dh)


def attention_probabilities(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) over the keys, masked keys at the dtype's minimum: (B, H, T, S)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1 = real token, 0 = padding  ->  (B, 1, 1, S) boolean key mask."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(query_len: int, key_len: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, S): query i, at absolute position S - T + i, sees keys 0 .. S - T + i.

    With a KV cache the T new queries come after P = S - T cached positions,
    so the same function serves training (P = 0) and cached decoding.
    """
    query_pos = torch.arange(query_len, device=device) + (key_len - query_len)  # (T,)
    key_pos = torch.arange(key_len, device=device)  # (S,)
    return (key_pos[None, :] <= query_pos[:, None])[None, None]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate Q, K, V projections.

    Self-attention appends this step's keys/values to `past` and returns the
    result as `present` (the KV cache). Cross-attention takes keys/values
    already projected from the encoder output (`memory_kv`), so a decoder
    computes them once per request instead of once per step.

    ``record_weights`` (off by default, and off in every served fast-path graph) makes the
    evaluation path keep its attention probabilities (B, H, T, S) in ``last_weights``: the
    attention-map graph (``attention_graphs.py``) returns them as outputs.
    """

    record_weights = False
    last_weights: torch.Tensor | None = None

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % num_heads == 0, f"d_model {d_model} is not divisible by num_heads {num_heads}"
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: torch.Tensor) -> KeyValue:
        """(B, S, D) -> keys and values, each (B, H, S, Dh)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        past: KeyValue | None = None,
        memory_kv: KeyValue | None = None,
    ) -> tuple[torch.Tensor, KeyValue | None]:
        q = self.split_heads(self.q_proj(x))  # (B, H, T, Dh)
        if memory_kv is not None:
            k, v = memory_kv  # (B, H, S, Dh), cross-attention: nothing to cache
            present = None
        else:
            k, v = self.project_kv(x)  # (B, H, T, Dh)
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, H, P + T, Dh)
                v = torch.cat([past[1], v], dim=2)
            present = (k, v)
        if self.training:
            # Training uses PyTorch's fused kernel (same mathematics, a fraction of the time and memory);
            # export and evaluation trace the explicit lecture formula above, which the ONNX graph keeps.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout.p)
        elif self.record_weights:
            self.last_weights = attention_probabilities(q, k, mask)  # (B, H, T, S)
            out = self.dropout(self.last_weights) @ v
        else:
            out = scaled_dot_product_attention(q, k, v, mask, self.dropout)  # (B, H, T, Dh)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)  # (B, T, D)
        return self.out_proj(out), present


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sin/cos positions (Vaswani et al. 2017), looked up by position id."""

    pe: torch.Tensor  # (L, D), a buffer: moves with the module, never trained or saved

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)  # (L, 1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe, persistent=False)  # (L, D)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.pe[position_ids]  # (B, T, D)


class LearnedPositionalEmbedding(nn.Embedding):
    """A trained vector per position (BERT, GPT, ViT), looked up by position id."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__(max_len, d_model)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2, applied to every position alike."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "gelu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class SublayerConnection(nn.Module):
    """Residual connection around a sublayer, with LayerNorm before (pre-LN) or after (post-LN).

    The original Transformer and BERT normalise after the residual sum
    (post-LN); GPT-2 style stacks normalise the sublayer's input (pre-LN),
    which trains more stably without long warmup.
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each inside a sublayer connection."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = True,
        activation: str = "gelu",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.attn_sublayer = SublayerConnection(d_model, dropout, norm_first, eps)
        self.ff_sublayer = SublayerConnection(d_model, dropout, norm_first, eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attn_sublayer(x, lambda h: self.self_attn(h, mask)[0])
        return self.ff_sublayer(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention (with a KV cache), optional cross-attention, feed-forward.

    With `cross_attention=False` this is the GPT block; with it, the
    Transformer decoder layer that also attends to the encoder output.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = True,
        cross_attention: bool = False,
        activation: str = "gelu",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.self_sublayer = SublayerConnection(d_model, dropout, norm_first, eps)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout) if cross_attention else None
        self.cross_sublayer = (
            SublayerConnection(d_model, dropout, norm_first, eps) if cross_attention else None
        )
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.ff_sublayer = SublayerConnection(d_model, dropout, norm_first, eps)

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor,
        past: KeyValue | None = None,
        memory_kv: KeyValue | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KeyValue]:
        present: KeyValue | None = None

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            nonlocal present
            out, present = self.self_attn(h, self_mask, past=past)
            return out

        x = self.self_sublayer(x, self_attention)
        if self.cross_attn is not None and self.cross_sublayer is not None:
            assert memory_kv is not None, "a cross-attention layer needs the encoder's keys/values"
            cross_attn = self.cross_attn
            x = self.cross_sublayer(x, lambda h: cross_attn(h, memory_mask, memory_kv=memory_kv)[0])
        x = self.ff_sublayer(x, self.feed_forward)
        assert present is not None
        return x, present


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform projections, small normal embeddings, zero biases (apply with `model.apply`).

    Xavier keeps the query/key products of a fresh model large enough that
    attention learns where to look within a few hundred steps. GPT-2's
    N(0, 0.02) for every matrix, scaled for 768-wide models, leaves a 256-wide
    one with near-uniform attention for hundreds of steps: a translator then
    sits on a plateau as a fluent target-language model that ignores its source.
    """
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def decoder_self_mask(attention_mask: torch.Tensor, query_len: int) -> torch.Tensor:
    """Padding and causal masks combined for T new queries over P + T keys: (B, 1, T, P + T).

    `attention_mask` (B, P + T) covers the cached past and the new tokens, so
    left padding anywhere in the past stays masked at every later step.
    """
    key_len = attention_mask.shape[1]
    return padding_mask(attention_mask) & causal_mask(query_len, key_len, attention_mask.device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: the first real token is position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
