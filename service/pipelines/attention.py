"""Attention maps on request (``return_attention``): one step after inference, for one answered input.

The served graphs never output attention (the fast path stays as it is), and the pipelines return
plain results. A request that asks for maps is answered through the usual batched path first; then
``with_attention`` runs the model's ``attention.onnx`` (the manifest's ``attention_maps``: fp32
reference weights exported with every layer's probabilities as outputs) once, for that one input, on
the model's compute thread, and picks one layer and one head (or the mean over heads). Each pipeline
that has maps says how through two small hooks (``AttentionHook``): how many tokens its input will
be, and the graph's feeds for the answered input. Weights are rounded to ``DECIMALS`` decimals, so a
row of n weights sums to 1 within n x 0.5e-5 (under 1e-3 for the default ATTENTION_MAX_TOKENS 128).

Such requests bypass the response cache both ways (``cache_control``): an answer with maps and one
without never stand in for each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from tokenizers import Tokenizer

from service.engine.repository import LoadedModel
from service.errors import InvalidInputError

from .results import AttentionMap, Outcome

DECIMALS = 5
R = TypeVar("R")


@dataclass(frozen=True)
class AttentionQuery:
    """What a request asks for: a layer (None: the last; negative counts from the end), a head (None: mean)."""

    layer: int | None = None
    head: int | None = None


@dataclass(frozen=True)
class Selection:
    layer: int  # 0-based, resolved
    head: int | None


@dataclass(frozen=True)
class AttentionFeeds:
    """One input as the attention graph takes it, and how its map is labelled.

    ``grid`` (ViT): the map is [CLS]'s row over the patches, laid out as ``grid`` = (rows, columns).
    """

    feeds: dict[str, np.ndarray]
    kind: str  # "cross" | "self" | "cls_to_patches"
    rows: list[str]
    columns: list[str]
    grid: tuple[int, int] | None = None


class AttentionHook(Protocol):
    """What a pipeline with attention maps provides."""

    name: str
    attention_maps: AttentionMaps

    def attention_length(self, item: Any) -> tuple[int, str]:
        """Blocking and cheap: the tokens ``item`` will be in the map, and the parameter to blame."""
        ...

    def attention_feeds(self, item: Any, result: Any) -> AttentionFeeds:
        """Blocking: the graph's feeds for ``item``, answered with ``result``."""
        ...

    async def attention_weights(self, feeds: dict[str, np.ndarray], selection: Selection) -> np.ndarray: ...


async def with_attention(
    pipeline: AttentionHook,
    query: AttentionQuery,
    item: Any,
    max_tokens: int,
    answer: Callable[[], Awaitable[Outcome[R]]],
) -> Outcome[R]:
    """``answer()`` (one input: ``item``), its first result carrying the map ``query`` asks for.

    The layer, head and length are checked before any inference is paid for.
    """
    maps = pipeline.attention_maps
    selection = maps.select(query)
    tokens, param = pipeline.attention_length(item)
    if tokens > max_tokens:
        raise InvalidInputError(
            f"{tokens} tokens; return_attention takes inputs of at most {max_tokens} (ATTENTION_MAX_TOKENS)",
            param,
            "too_long",
        )
    outcome = await answer()
    first = outcome.results[0]
    feeds = await asyncio.to_thread(
        pipeline.attention_feeds, item, first
    )  # tokenizing, decoding: off the loop
    weights = await pipeline.attention_weights(feeds.feeds, selection)
    attention_map = maps.render(feeds, selection, weights)
    results = [dataclasses.replace(first, attention=attention_map), *outcome.results[1:]]  # type: ignore[type-var]
    return dataclasses.replace(outcome, results=results)


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

    def weights(self, feeds: dict[str, np.ndarray], selection: Selection) -> np.ndarray:
        """Blocking: the (queries, keys) probabilities of the one input in ``feeds``, for ``selection``."""
        assert self.graph is not None and self.spec is not None, "select() first"
        name = self.spec.output_names[selection.layer]
        probs = self.graph.run({n: feeds[n] for n in self.graph.input_names}, [name])[0][0]  # (H, T, S)
        return probs.mean(0) if selection.head is None else probs[selection.head]

    def render(self, input: AttentionFeeds, selection: Selection, weights: np.ndarray) -> AttentionMap:
        """The map of ``input`` for ``selection`` from its ``weights``, rounded to ``DECIMALS``."""
        assert self.spec is not None
        grid, cls_weight = None, None
        if (
            input.grid is not None
        ):  # [CLS] over [CLS] + patches: [CLS]'s own weight apart, the rest as the grid
            cls_row = weights[0]
            cls_weight = round(float(cls_row[0]), DECIMALS)
            weights = cls_row[1:].reshape(input.grid)
            grid = list(input.grid)
        return AttentionMap(
            kind=input.kind,
            layer=selection.layer,
            head=selection.head,
            num_layers=self.spec.num_layers,
            num_heads=self.spec.num_heads,
            rows=input.rows,
            columns=input.columns,
            weights=np.round(weights.astype(np.float64), DECIMALS).tolist(),
            grid=grid,
            cls_weight=cls_weight,
        )


def wordpiece_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """BERT's own token strings ([CLS], play, ##ing, [SEP]): the rows and columns of a self-attention map."""
    return [tokenizer.id_to_token(i) or str(i) for i in ids]


def decoded_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Each byte-level BPE token decoded alone (" the", "</s>"): readable where the raw string is "Ġthe"."""
    return [tokenizer.decode([i], skip_special_tokens=False) or str(i) for i in ids]
