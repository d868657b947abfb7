"""What the pipelines return: plain dataclasses, so the core knows nothing of JSON or HTTP.

Each response schema builds itself from one of these (``ClassificationOut.of``,
...); the response cache stores them as JSON through a pydantic ``TypeAdapter``
(``service.cache.response_cache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.engine.sampling import TokenLogprob

R = TypeVar("R")


@dataclass(frozen=True)
class Usage:
    """Token counts of one request: tokens fed to the model(s), and tokens generated."""

    input_tokens: int
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @classmethod
    def of_generations(cls, generations: Sequence[Generation], choices: int = 1) -> Usage:
        """The one count of a generation request: each prompt's tokens once (``generations`` holds
        ``choices`` per prompt, prompt-major), every generated token."""
        return cls(
            input_tokens=sum(g.prompt_tokens for g in generations[::choices]),
            output_tokens=sum(g.completion_tokens for g in generations),
        )


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """One request's results (same order as its inputs) and what produced them.

    ``cached`` is the response-cache seam: pipelines always compute (False); a
    cache in front of them returns stored outcomes with ``cached=True``.
    """

    model: str
    model_version: str
    results: list[R]
    usage: Usage
    cached: bool = False


@dataclass(frozen=True)
class AttentionMap:
    """One input's attention weights from one layer (one head, or the mean over heads): ``return_attention``.

    ``weights[i][j]``: how much row ``i`` attends to column ``j``; each row of a "cross" or "self"
    map sums to 1. "cls_to_patches" (ViT) is the [CLS] row over the patches laid out as the patch
    grid (``grid`` = [rows, columns] of patches): it sums to 1 with ``cls_weight``, [CLS] on itself.
    """

    kind: str  # "cross" (target tokens x source tokens) | "self" (tokens x tokens) | "cls_to_patches"
    layer: int  # 0-based
    head: int | None  # None: the mean over heads
    num_layers: int
    num_heads: int
    rows: list[str]  # row labels: target tokens, tokens, or patch-grid row numbers
    columns: list[str]  # column labels: source tokens, tokens, or patch-grid column numbers
    weights: list[list[float]]
    grid: list[int] | None = None  # cls_to_patches: [patch rows, patch columns]
    cls_weight: float | None = None  # cls_to_patches: [CLS]'s weight on itself


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    label: str  # the most probable label
    score: float  # its softmax probability
    top: list[LabelScore]  # the top_k labels, most probable first
    truncated: bool = False  # the text was cut to the model's window
    attention: AttentionMap | None = None  # with return_attention, for the one input


@dataclass(frozen=True)
class TranslationSequence:
    text: str
    score: float  # length-penalised log-probability (beam) or mean token log-probability (greedy)
    finish_reason: str  # "eos" | "length"
    tokens: int  # generated tokens, </s> excluded
    token_ids: list[int] = field(default_factory=list)  # those tokens (what an attention map's rows are)


@dataclass(frozen=True)
class Translation:
    sequences: list[TranslationSequence]  # best first, num_return_sequences of them
    truncated: bool = False  # the source was cut to the model's max_source_length
    attention: AttentionMap | None = None  # with return_attention, for the one input
    sentences: int = 1  # the sentences the text was translated as (``pipelines/documents.py``)


@dataclass(frozen=True)
class TranslationScore:
    """A given translation's log-probability under the model (CTranslate2's ``score_batch``)."""

    tokens: list[str]  # the translation's tokens as the model's vocabulary spells them, </s> last
    token_logprobs: list[float]  # one per token
    logprob: float  # their sum
    length: int  # len(tokens)
    truncated: bool = False  # the source was cut to the model's max_source_length


@dataclass(frozen=True)
class Answer:
    answer: str
    start: int  # character offsets into the context: answer == context[start:end]
    end: int
    score: float  # p(start) * p(end) within the window the span came from
    window: int | None  # index of that sliding window (None: the context held no usable token)
    windows: int  # how many windows the context was cut into
    attention: AttentionMap | None = None  # with return_attention, for the one input


@dataclass(frozen=True)
class EntitySpan:
    text: str
    label: str
    start: int  # character offsets into the input text: text == input[start:end]
    end: int
    score: float  # mean probability of the entity's word tags


@dataclass(frozen=True)
class Entities:
    entities: list[EntitySpan]
    truncated: bool = False  # words beyond the model's window were not tagged
    attention: AttentionMap | None = None  # with return_attention, for the one input


@dataclass(frozen=True)
class Embedding:
    vector: list[float]  # the sentence embedding: unit length unless the request asked normalize: false
    truncated: bool = False  # the text was cut to the model's window


@dataclass(frozen=True)
class Score:
    """How relevant a document is to a query (rerank, score): one (query, document) pair's number."""

    score: float  # the relevance: a cross-encoder's sigmoid of its logit; an embedder's cosine as it is
    raw: float  # before any activation (TEI's raw_scores): the logit; for an embedder the same cosine
    scored_by: str  # "cosine": an embedder's vectors; "cross-encoder": a model that read the pair
    truncated: bool = False  # the query or the document was cut to the model's window


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: str  # "length" | "stop" | "eos"
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None  # per generated token, with SamplingParams.logprobs
    prompt_logprobs: list[TokenLogprob] | None = None  # per prompt token, with prompt_logprobs
