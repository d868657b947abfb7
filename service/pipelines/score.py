"""Relevance of (query, document) pairs (rerank and score): what scores them, as the core sees it.

A ``PairScorer`` takes a request's pairs and answers one ``Score`` per pair, in order. A served model whose
task scores pairs (a cross-encoder, task ``rerank``) is its own scorer; where none is served, the
embedder scores, as vLLM does: ``CosineScorer`` embeds every distinct text of the request once, through
the embedder's own batcher (so a request's texts are batched with other requests' texts), and answers the
cosine of each pair's unit-length vectors. ``scored_by`` says which kind of number came back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta

from .embed import SentenceEmbedder
from .results import Outcome, Score
from .text_inputs import CUT_RIGHT, Truncation

RERANK = "rerank"  # the task of a request for pair scores, whichever model answers it


@runtime_checkable
class PairScorer(Protocol):
    """What scores a request's (query, document) pairs: its model's name, version (``model``) and task."""

    task: str
    scored_by: str  # "cosine" (an embedder's vectors) or "cross-encoder" (a model that reads each pair)
    model: Any  # the LoadedModel: .version, the manifest's content hash

    @property
    def name(self) -> str: ...

    def leased(self) -> contextlib.AbstractContextManager[Any]: ...

    async def score(
        self,
        pairs: Sequence[tuple[str, str]],
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Score]:
        """One score per pair, in order; a text over the window is cut or refused as ``truncation`` says (the
        error naming ``queries`` or ``documents`` and the pair's index)."""
        ...


class CosineScorer:
    """Pairs scored by an embedder: the cosine of the query's and the document's sentence embeddings."""

    task = RERANK
    scored_by = "cosine"

    def __init__(self, embedder: SentenceEmbedder) -> None:
        self.embedder = embedder
        self.model = embedder.model

    @property
    def name(self) -> str:
        return self.embedder.name

    @contextlib.contextmanager
    def leased(self) -> Iterator[CosineScorer]:
        with self.embedder.leased():
            yield self

    async def score(
        self,
        pairs: Sequence[tuple[str, str]],
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Score]:
        """Each distinct text embedded once (one query against many documents: the query once), then
        each pair's dot product of unit vectors, in float64. Usage counts the tokens embedded."""
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        try:
            embedded = await self.embedder.embed(texts, True, truncation, meta)
        except InvalidInputError as exc:
            if exc.index is not None and exc.field == "inputs":  # a distinct text: the first pair holding it
                text = texts[exc.index]
                exc.index, exc.field = next(
                    (i, "queries" if q == text else "documents")
                    for i, (q, d) in enumerate(pairs)
                    if text in (q, d)
                )
            raise
        by_text = {text: e for text, e in zip(texts, embedded.results, strict=True)}
        results = []
        for query, document in pairs:
            q, d = by_text[query], by_text[document]
            cosine = float(np.dot(np.asarray(q.vector, np.float64), np.asarray(d.vector, np.float64)))
            results.append(Score(cosine, cosine, self.scored_by, q.truncated or d.truncated))
        return Outcome(self.name, self.model.version, results, embedded.usage)
