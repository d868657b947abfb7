"""Attention maps on request (``return_attention``): one input through the model's attention graph.

The served graphs never output attention (the fast path stays as it is). A request that asks for
maps gets its answer through the usual batched path first; then its pipeline runs the model's
``attention.onnx`` (the manifest's ``attention_maps``: fp32 reference weights exported with every
layer's probabilities as outputs) once, for that one input, on the model's compute thread, and picks
one layer and one head (or the mean over heads). Weights are rounded to ``DECIMALS`` decimals, so a
row of n weights sums to 1 within n x 0.5e-5 (under 1e-3 for the default ATTENTION_MAX_TOKENS 128).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from service.engine.repository import LoadedModel
from service.errors import InvalidInputError

from .results import AttentionMap

DECIMALS = 5


@dataclass(frozen=True)
class AttentionQuery:
    """What a request asks for: a layer (None: the last; negative counts from the end), a head (None: mean)."""

    layer: int | None = None
    head: int | None = None
    max_tokens: int = 128  # ATTENTION_MAX_TOKENS: the most rows or columns a map may have


@dataclass(frozen=True)
class Selection:
    layer: int  # 0-based, resolved
    head: int | None


class AttentionMaps:
    """One model's attention graph, and the checks and picking every pipeline shares."""

    def __init__(self, model: LoadedModel) -> None:
        self.model_name = model.name
        self.graph = model.attention
        self.spec = model.manifest.attention_maps

    def select(self, query: AttentionQuery) -> Selection:
        """The layer and head ``query`` names, checked against the model (422 naming the field)."""
        if self.graph is None or self.spec is None:
            raise InvalidInputError(
                f"model {self.model_name} has no attention maps (its folder has no attention graph)",
                "return_attention",
                "unsupported",
            )
        layers, heads = self.spec.num_layers, self.spec.num_heads
        layer = layers - 1 if query.layer is None else query.layer
        if not -layers <= layer < layers:
            raise InvalidInputError(
                f"{layer} is not a layer of {self.model_name}: it has {layers} (0..{layers - 1}, or "
                f"-{layers}..-1 from the last)",
                "attention_layer",
                "out_of_range",
            )
        if query.head is not None and not 0 <= query.head < heads:
            raise InvalidInputError(
                f"{query.head} is not a head of {self.model_name}: it has {heads} (0..{heads - 1}; "
                "null for the mean over heads)",
                "attention_head",
                "out_of_range",
            )
        return Selection(layer % layers, query.head)

    @staticmethod
    def check_length(tokens: int, query: AttentionQuery, field: str) -> None:
        if tokens > query.max_tokens:
            raise InvalidInputError(
                f"{tokens} tokens; return_attention takes inputs of at most {query.max_tokens} "
                "(ATTENTION_MAX_TOKENS)",
                field,
                "too_long",
            )

    def weights(self, feeds: dict[str, np.ndarray], selection: Selection) -> np.ndarray:
        """Blocking: the (queries, keys) probabilities of the one input in ``feeds``, for ``selection``."""
        assert self.graph is not None and self.spec is not None, "select() first"
        name = self.spec.output_names[selection.layer]
        probs = self.graph.run({n: feeds[n] for n in self.graph.input_names}, [name])[0][0]  # (H, T, S)
        return probs.mean(0) if selection.head is None else probs[selection.head]

    def result(
        self,
        kind: str,
        selection: Selection,
        rows: list[str],
        columns: list[str],
        weights: np.ndarray,
        grid: list[int] | None = None,
        cls_weight: float | None = None,
    ) -> AttentionMap:
        assert self.spec is not None
        return AttentionMap(
            kind=kind,
            layer=selection.layer,
            head=selection.head,
            num_layers=self.spec.num_layers,
            num_heads=self.spec.num_heads,
            rows=rows,
            columns=columns,
            weights=np.round(weights.astype(np.float64), DECIMALS).tolist(),
            grid=grid,
            cls_weight=None if cls_weight is None else round(float(cls_weight), DECIMALS),
        )


def wordpiece_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """BERT's own token strings ([CLS], play, ##ing, [SEP]): the rows and columns of a self-attention map."""
    return [tokenizer.id_to_token(i) or str(i) for i in ids]


def decoded_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Each byte-level BPE token decoded alone (" the", "</s>"): readable where the raw string is "Ġthe"."""
    return [tokenizer.decode([i], skip_special_tokens=False) or str(i) for i in ids]
