"""Cross-encoders (task rerank): a BERT that reads each (query, document) pair together and answers one logit.

One query with N documents is N pairs, each a batcher item of its own, so a request's pairs are batched
with other requests' pairs (TEI's rerank). Each pair is encoded ``[CLS] query [SEP] document [SEP]`` with
its segment ids, cut to the window by ``classify.pair_positions`` (the longer text loses tokens first, as
transformers' ``longest_first``). The score is the logit's sigmoid, as sentence-transformers'
``CrossEncoder`` answers for a one-label model, or the logit itself where the manifest's ``ranking.score``
says ``identity`` (a cross-encoder that declared it); the logit is kept either way (TEI's ``raw_scores``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.repository import LoadedModel
from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta

from .base import Building, TextEncoderPipeline, Workers
from .classify import PairIds, pair_ids
from .contract import TRUNCATION_PARAMETERS, TaskContract, TensorSpec, text_input
from .results import Outcome, Score, Usage
from .score import RERANK
from .text_inputs import CUT_RIGHT, Truncation, preprocess


def identity(logit: float) -> float:
    return logit


def sigmoid(logit: float) -> float:
    """1 / (1 + e^-x), without overflow for logits of either sign."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    z = math.exp(logit)
    return z / (1.0 + z)


# the manifest's ``ranking.score`` -> the score answered for a logit: the sigmoid (sentence-transformers'
# default for one label), or the logit itself (a cross-encoder that declares the identity, as ms-marco's do)
SCORES = {"sigmoid": sigmoid, "identity": identity}


class CrossEncoder(TextEncoderPipeline[PairIds, float]):
    """(query, document) pairs -> relevance: the model's one logit per pair, and its sigmoid."""

    contract = TaskContract(
        RERANK,
        "bert-reranker",
        (text_input("query", "the query, UTF-8 text"), text_input("document", "the document, UTF-8 text")),
        (
            TensorSpec(
                "score", "FP32", "the relevance: the logit's sigmoid, in (0, 1)", value=lambda s: s.score
            ),
            TensorSpec("raw_score", "FP32", "the logit, before the sigmoid", value=lambda s: s.raw),
        ),
        TRUNCATION_PARAMETERS,
    )
    scored_by = "cross-encoder"

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        observer: BatcherObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        ranking = (model.manifest.model_extra or {}).get("ranking") or {}
        score = ranking.get("score", "sigmoid")
        if score not in SCORES:  # the loader refuses the folder, naming it
            raise ValueError(f"manifest ranking.score is {score!r}: one of {sorted(SCORES)}")
        self.activation = SCORES[score]

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> CrossEncoder:
        return cls(model, building.policy(), building.batcher_observer(model.name), building.workers)

    def run_batch(self, items: list[PairIds]) -> Sequence[float]:
        logits = self.run_padded([item.ids for item in items], [item.type_ids for item in items])[0]
        return [float(x) for x in np.asarray(logits).reshape(len(items), -1)[:, 0]]

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], truncation: Truncation = CUT_RIGHT
    ) -> list[tuple[PairIds, bool]]:
        """Each pair's ids and segment ids cut to the window, and whether they were cut; a pair over it with
        ``truncate: false`` is refused, naming ``documents`` and the pair's index."""
        try:
            return [
                pair_ids(self.tokenizer, query, document, self.max_len, truncation, index)
                for index, (query, document) in enumerate(pairs)
            ]
        except InvalidInputError as exc:
            exc.field = "documents"
            raise

    async def score(
        self,
        pairs: Sequence[tuple[str, str]],
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Score]:
        """One score per pair, in order: all the pairs admitted at once, before tokenisation is paid for."""
        with self.batcher.reserve(len(pairs), meta) as permit:
            size = sum(len(q) + len(d) for q, d in pairs)
            encoded = await preprocess(size, self.encode_pairs, pairs, truncation)
            items = [ids for ids, _ in encoded]
            logits = await self.infer(items, [len(ids) for ids in items], permit, meta)
        results = [
            Score(self.activation(x), x, self.scored_by, truncated)
            for x, (_, truncated) in zip(logits, encoded, strict=True)
        ]
        return Outcome(self.name, self.model.version, results, Usage(sum(len(ids) for ids in items)))

    async def warmup(self) -> None:
        await self.score([("warm-up", "a warm-up document")])
