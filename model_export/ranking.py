"""Passage ranking on SQuAD, the reranker's data and its measure: each question against its article's paragraphs.

A question's own paragraph is relevant; the other paragraphs of the same article are the candidates it
must beat (hard negatives: same topic, many shared words). Three rankers are measured the same way, by
MRR@10 and accuracy@1 on the same questions:

- BM25 (Okapi, ``rank_bm25``) over the article's paragraphs, lower-cased words;
- the embedder's cosine between the question's and each paragraph's sentence embedding;
- the reranker, as it is used: it re-orders BM25's first ``candidates`` paragraphs (retrieve, then
  rerank). A relevant paragraph BM25 did not retrieve counts as not found for the reranker too.

The questions are spread evenly over the split (a fixed stride), so a limit samples every article rather
than the first few.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi
from tokenizers import Tokenizer

from service.pipelines.classify import pair_ids
from service.pipelines.text_inputs import CUT_RIGHT, pad_batch

from .data import load_squad

WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@dataclass(frozen=True)
class RankingQuery:
    question: str
    passages: tuple[str, ...]  # every paragraph of the question's article, in file order
    relevant: int  # the index of its own paragraph among them
    bm25: tuple[int, ...]  # the passages' indices, BM25's best first


@cache
def _article_index(passages: tuple[str, ...]) -> BM25Okapi:
    return BM25Okapi([words(p) for p in passages])


def bm25_order(question: str, passages: tuple[str, ...]) -> tuple[int, ...]:
    """The passages' indices by BM25 score for ``question``, best first (ties: file order)."""
    scores = _article_index(passages).get_scores(words(question))
    return tuple(int(i) for i in np.argsort(-scores, kind="stable"))


def ranking_queries(data_dir: str | Path, split: str, limit: int | None = None) -> list[RankingQuery]:
    """The split's questions with their articles' paragraphs; ``limit`` of them, spread evenly over it."""
    examples = load_squad(data_dir, split)
    articles: dict[str, dict[str, int]] = {}
    for ex in examples:
        articles.setdefault(ex.title, {}).setdefault(ex.context, len(articles[ex.title]))
    if limit is not None and limit < len(examples):
        stride = len(examples) / limit
        examples = [examples[int(k * stride)] for k in range(limit)]
    queries = []
    for ex in examples:
        paragraphs = articles[ex.title]
        passages = tuple(paragraphs)
        queries.append(
            RankingQuery(ex.question, passages, paragraphs[ex.context], bm25_order(ex.question, passages))
        )
    return queries


def rank_of(order: Sequence[int], relevant: int) -> int | None:
    """The relevant passage's 1-based rank in ``order`` (None: not in it)."""
    return next((r for r, i in enumerate(order, 1) if i == relevant), None)


def measures(ranks: Sequence[int | None]) -> dict[str, float]:
    """MRR@10 (the reciprocal rank of the relevant passage, 0 past the tenth) and accuracy@1."""
    n = max(1, len(ranks))
    return {
        "mrr_at_10": round(sum(1.0 / r for r in ranks if r is not None and r <= 10) / n, 4),
        "accuracy_at_1": round(sum(1 for r in ranks if r == 1) / n, 4),
    }


def bm25_measures(queries: Sequence[RankingQuery]) -> dict[str, float]:
    return measures([rank_of(q.bm25, q.relevant) for q in queries])


# texts -> unit-length embeddings (N, D)
Embed = Callable[[list[str]], np.ndarray]


def cosine_measures(queries: Sequence[RankingQuery], embed: Embed) -> dict[str, float]:
    """Each question against every paragraph of its article by the cosine of their embeddings."""
    passages = sorted({p for q in queries for p in q.passages})
    vectors = dict(zip(passages, embed(passages), strict=True))
    questions = embed([q.question for q in queries])
    ranks = []
    for q, v in zip(queries, questions, strict=True):
        scores = np.array([float(np.dot(vectors[p], v)) for p in q.passages])
        ranks.append(rank_of([int(i) for i in np.argsort(-scores, kind="stable")], q.relevant))
    return measures(ranks)


# (query, passage) pairs -> one relevance score each
ScorePairs = Callable[[list[tuple[str, str]]], np.ndarray]


def reranker_measures(
    queries: Sequence[RankingQuery], score: ScorePairs, candidates: int
) -> dict[str, float]:
    """BM25's first ``candidates`` paragraphs of each question, re-ordered by ``score``."""
    pairs = [(q.question, q.passages[i]) for q in queries for i in q.bm25[:candidates]]
    scores = np.asarray(score(pairs), dtype=np.float64)
    ranks, at = [], 0
    for q in queries:
        shortlist = q.bm25[:candidates]
        own = scores[at : at + len(shortlist)]
        at += len(shortlist)
        ranks.append(rank_of([shortlist[i] for i in np.argsort(-own, kind="stable")], q.relevant))
    return measures(ranks)


# feeds by input name -> the graph's outputs (an ONNX graph's ``run``, or a torch module's: ``probes``)
Run = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]


def encode_pair(tok: Tokenizer, question: str, passage: str, max_len: int) -> tuple[list[int], list[int]]:
    """``[CLS] question [SEP] passage [SEP]`` and its segment ids, cut to ``max_len`` as the service cuts a
    pair (``classify.pair_positions``: the longer text loses its end first)."""
    ids, _ = pair_ids(tok, question, passage, max_len, CUT_RIGHT, 0)
    return ids.ids, ids.type_ids


def score_pairs(run: Run, tok: Tokenizer, max_len: int, pad: int, batch_size: int = 32) -> ScorePairs:
    """(question, passage) pairs -> the cross-encoder's logits through ``run``, batched by length."""

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        encoded = [encode_pair(tok, q, p, max_len) for q, p in pairs]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
        out = np.zeros(len(encoded))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            feeds = pad_batch([encoded[i][0] for i in idx], pad, [encoded[i][1] for i in idx])
            out[idx] = np.asarray(run(feeds)[0]).reshape(len(idx), -1)[:, 0]
        return out

    return score
