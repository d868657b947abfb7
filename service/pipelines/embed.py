"""Sentence embeddings (feature-extraction): one vector per text, the mean of BERT's states over real tokens.

The graph returns each text's embedding L2-normalised and before normalisation
(the manifest's ``embedding`` section names both); a batch may mix requests that
want either, so every item carries both and each request takes the one it asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.manifest import required
from service.engine.repository import LoadedModel
from service.metadata import ANONYMOUS, RequestMeta

from .base import TextPipeline, Workers
from .contract import TRUNCATION_PARAMETERS, Parameter, TaskContract, TensorSpec, text_input
from .results import Embedding, Outcome, Usage
from .text_inputs import CUT_RIGHT, Truncation, feeds_for, pad_batch


@dataclass(frozen=True)
class Vectors:
    """One text's embedding, (D,) float32 each."""

    normalized: np.ndarray  # unit length: what cosine similarity compares
    pooled: np.ndarray  # the mean over real tokens, before normalisation


class SentenceEmbedder(TextPipeline[Vectors]):
    """Text -> embedding. Texts longer than the model's window are cut to it (``truncated``), as in classify."""

    contract = TaskContract(
        "feature-extraction",
        "bert-embedder",
        (text_input("text", "UTF-8 text"),),
        (
            TensorSpec(
                "embedding",
                "FP32",
                "the sentence embedding (unit length by default)",
                (-1, "dimensions"),
                value=lambda e: e.vector,
            ),
        ),
        (
            Parameter(
                "normalize", "bool", "false gives the mean-pooled vector, not normalised (default true)"
            ),
            *TRUNCATION_PARAMETERS,
        ),
    )

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        observer: BatcherObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        self.spec = required(model.manifest.embedding)
        self.dimensions = self.spec.dimensions

    def run_batch(self, items: list[list[int]]) -> Sequence[Vectors]:
        feeds = feeds_for(self.graph, pad_batch(items, self.pad_id))
        normalized, pooled = self.graph.run(feeds, [self.spec.normalized_output, self.spec.pooled_output])
        return [Vectors(normalized[j], pooled[j]) for j in range(len(items))]

    async def embed(
        self,
        texts: Sequence[str],
        normalize: bool,
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Embedding]:
        encoded, vectors = await self.run_texts(texts, truncation, meta)
        results = [
            Embedding((v.normalized if normalize else v.pooled).tolist(), e.truncated)
            for v, e in zip(vectors, encoded, strict=True)
        ]
        usage = Usage(input_tokens=sum(len(e.ids) for e in encoded))
        return Outcome(self.name, self.model.version, results, usage)

    async def warmup(self) -> None:
        await self.embed(["warm-up"], normalize=True)
