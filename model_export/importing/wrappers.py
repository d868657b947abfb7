"""A Hugging Face model behind the house's graph signatures: the checkpoint's own ``transformers`` code.

Each wrapper is a torch module whose ``forward`` takes and returns exactly what the service feeds the
house's graphs (``docs/MODEL_REPOSITORY.md``, "Graph signatures") and calls the ``transformers``
model inside, so the exported graph computes what ``transformers`` computes, by construction:

- BERT-family heads: (input_ids, attention_mask[, token_type_ids]) -> the head's logits (DistilBERT
  has no segments, so its graph has no ``token_type_ids``: the service feeds a graph only its inputs);
- sentence embeddings: the encoder's last states averaged over real tokens, and L2-normalised;
- GPT-2: (input_ids, attention_mask, position_ids, past_key.i, past_value.i ...) -> (logits, present ...);
- Marian: the encoder returns every decoder layer's cross-attention keys/values, computed once per
  request; the decoder takes one step with them and its self-attention cache;
- ViT: pixel_values -> logits.

Every attention runs as ``house_attention``: ``transformers``' eager attention written in this project's
own pattern, so the variants stage fuses it and builds the decoders' in-place KV step graph as for the
house's models. The attention-map wrappers return its probabilities.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

HOUSE_ATTENTION = "house"


def house_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
    """``transformers``' attention written as this project's own (``model_export/models/layers.py``).

    The same function as ``transformers``' eager attention, in the pattern ``fusion.fuse_attention``
    rewrites into one ONNX ``Attention`` and ``inplace_kv.py`` into ``GroupQueryAttention`` over the KV
    buffer: scores scaled, set to the dtype's minimum where the (boolean) mask forbids, softmax, times
    the values. Returns (B, T, H, Dh) and the probabilities, as every ``transformers`` attention does.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(-2, -1)) * scaling  # (B, H, T, S)
    if attention_mask is not None:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _boolean_mask(*args: Any, **kwargs: Any) -> Any:
    """``transformers``' boolean mask (True: attend), always built (never skipped for a causal kernel)."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_house_attention() -> str:
    """``house_attention`` and its mask under one name ``transformers`` models accept; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(HOUSE_ATTENTION, house_attention)
    AttentionMaskInterface.register(HOUSE_ATTENTION, _boolean_mask)
    return HOUSE_ATTENTION


def exportable(model: Any) -> Any:
    """The model in eval mode with ``house_attention`` in every module (what the graphs are exported from)."""
    name = register_house_attention()
    model.config._attn_implementation = name
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = name
    return model.eval()


class EncoderHead(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> the head's outputs (``outputs`` of the HF model)."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...], segments: bool) -> None:
        super().__init__()
        self.model = model
        self.outputs = outputs
        self.segments = segments

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
        kwargs = {"token_type_ids": token_type_ids} if self.segments else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return tuple(getattr(out, name) for name in self.outputs)


class MeanPooledEmbedding(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> (L2-normalised mean of the last states, the mean)."""

    def __init__(self, model: nn.Module, segments: bool) -> None:
        super().__init__()
        self.model = model
        self.segments = segments

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
        kwargs = {"token_type_ids": token_type_ids} if self.segments else {}
        states = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # (B, D)
        normalized = pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return normalized, pooled


def _cache(pairs: list[tuple[torch.Tensor, torch.Tensor]], config: Any):  # type: ignore[no-untyped-def]
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=pairs, config=config)


class CausalLMWithCache(nn.Module):
    """GPT-2: (input_ids, attention_mask, position_ids, *past) -> (logits, *present)."""

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=_cache(pairs, self.model.config),
            use_cache=True,
        )
        cache = out.past_key_values
        return (out.logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


class Seq2SeqEncoder(nn.Module):
    """Marian: (input_ids, attention_mask) -> every decoder layer's cross-attention keys and values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
        states = self.model.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state
        out = []
        for layer in self.model.get_decoder().layers:
            attention = layer.encoder_attn
            shape = (*states.shape[:-1], -1, attention.head_dim)
            out.append(attention.k_proj(states).view(shape).transpose(1, 2))  # (B, H, S, Dh)
            out.append(attention.v_proj(states).view(shape).transpose(1, 2))
        return tuple(out)


class Seq2SeqDecoder(nn.Module):
    """Marian: (input_ids, attention_mask, position_ids, encoder_attention_mask, *cross, *past) -> (logits, *present).

    The decoder's own layers, embeddings and output projection, run as ``MarianDecoder.forward`` runs them,
    with the cross keys/values the encoder graph computed (``EncoderDecoderCache`` marked updated, so no
    layer recomputes them) and the positions the service feeds.
    """

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, position_ids, encoder_attention_mask, *kv):  # type: ignore[no-untyped-def]
        from transformers import EncoderDecoderCache

        n = self.num_layers
        cross = [(kv[2 * i], kv[2 * i + 1]) for i in range(n)]
        past = [(kv[2 * n + 2 * i], kv[2 * n + 2 * i + 1]) for i in range(n)]
        config = self.model.config
        cache = EncoderDecoderCache(_cache(past, config), _cache(cross, config))
        for i in range(n):
            cache.is_updated[i] = True
        decoder = self.model.get_decoder()
        embeds = decoder.embed_tokens(input_ids) * decoder.embed_scale  # (B, T, D)
        hidden = embeds + decoder.embed_positions(input_ids.shape, position_ids=position_ids)
        length, total = input_ids.shape[1], attention_mask.shape[1]
        past_length = total - length
        rows = torch.arange(length).unsqueeze(1) + past_length  # (T, 1): each query's absolute position
        causal = torch.arange(total).unsqueeze(0) <= rows  # (T, S)
        self_mask = causal[None, None] & attention_mask.bool()[:, None, None, :]  # (B, 1, T, S)
        cross_mask = encoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S_src)
        for layer in decoder.layers:  # the masks are 4-D: transformers takes them as they are
            hidden = layer(
                hidden,
                self_mask,
                kv[0],  # marks the cross-attention path; its keys/values come from the cache
                encoder_attention_mask=cross_mask,
                cache=cache,
                use_cache=True,
            )
        logits = self.model.lm_head(hidden) + self.model.final_logits_bias
        presents = cache.self_attention_cache.layers
        return (logits, *[t for layer in presents for t in (layer.keys, layer.values)])


class ImageClassifierLogits(nn.Module):
    """ViT: pixel_values -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values):  # type: ignore[no-untyped-def]
        return self.model(pixel_values=pixel_values).logits


class EncoderAttentions(nn.Module):
    """BERT family: (input_ids, attention_mask[, token_type_ids]) -> every layer's self-attention (B, H, T, T)."""

    def __init__(self, model: nn.Module, segments: bool) -> None:
        super().__init__()
        self.model = model
        self.segments = segments

    def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
        kwargs = {"token_type_ids": token_type_ids} if self.segments else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True, **kwargs)
        return tuple(out.attentions)


class ImageAttentions(nn.Module):
    """ViT: pixel_values -> every layer's self-attention over [CLS] + patches (B, H, N + 1, N + 1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values):  # type: ignore[no-untyped-def]
        return tuple(self.model(pixel_values=pixel_values, output_attentions=True).attentions)


class CrossAttentions(nn.Module):
    """Marian: (input_ids, attention_mask, decoder_input_ids) -> every decoder layer's cross-attention (B, H, T, S)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):  # type: ignore[no-untyped-def]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            output_attentions=True,
            use_cache=False,
        )
        return tuple(out.cross_attentions)
