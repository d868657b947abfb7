"""bert-reranker: a cross-encoder on the shared BERT encoder, trained on SQuAD's passage ranking.

Each training question is read against its own paragraph and ``negatives`` other paragraphs of the same
article: BM25's best-scoring ones first (the hard negatives a retriever actually returns), the rest
drawn at random from the article. The model (``BertForPairRanking``) reads the pair together and answers
one logit: the scaled cosine of the two segments' mean-pooled states plus a [CLS] head that starts at
zero, so the MiniLM sentence encoder ranks by its own similarity from the first step. It is trained
listwise (a softmax over each question's group, its own paragraph the target) plus a pointwise binary
cross-entropy on every pair, so that the served sigmoid of the logit reads as a relevance probability.
The encoder's embeddings and first ``frozen_layers`` layers stay as the checkpoint has them (no gradient
below: a cheaper step). The build measures it by ``ranking.py`` through the served ONNX file.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from service.pipelines.text_inputs import pad_batch

from ..models.bert import BertEncoder, BertForPairRanking
from ..profiles import BertRerankerRecipe
from ..ranking import RankingQuery, encode_pair, ranking_queries, reranker_measures, score_pairs
from ..tokenization import special_token_ids
from ..training import Probe, TrainResult
from . import probes
from .bert import _head_job, _head_manifest, length_bucketed
from .bert_encoder import prepare_encoder
from .common import BuildContext, Trained, TrainingJob
from .probes import torch_run

log = logging.getLogger(__name__)

POINTWISE = 0.2  # the binary cross-entropy's weight beside the listwise loss: calibration, not ranking


def groups(queries: list[RankingQuery], negatives: int, seed: int) -> list[list[int]]:
    """Per question, its own paragraph's index then ``negatives`` others: BM25's best first, half of them,
    the rest at random from the article (fewer where the article is short)."""
    rng = random.Random(seed)
    out = []
    for q in queries:
        others = [i for i in q.bm25 if i != q.relevant]
        hard = others[: (negatives + 1) // 2]
        rest = others[len(hard) :]
        easy = rng.sample(rest, min(len(rest), negatives - len(hard)))
        out.append([q.relevant, *hard, *easy])
    return out


SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def idf_weights(tok: Tokenizer, queries: list[RankingQuery], special: Sequence[str]) -> np.ndarray:
    """Each token id's inverse document frequency over the training paragraphs (BM25's, never below 0;
    the special tokens 0): the exact-match head's starting term weights."""
    paragraphs = sorted({p for q in queries for p in q.passages})
    df = np.zeros(tok.get_vocab_size(), np.float64)
    for e in tok.encode_batch(paragraphs):
        df[sorted(set(e.ids))] += 1
    idf = np.log((len(paragraphs) - df + 0.5) / (df + 0.5) + 1.0).astype(np.float32)
    idf[list(special_token_ids(tok, list(special)).values())] = 0.0
    return idf


def pad_rows(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs' ids and segment ids, right-padded as the service pads them."""
    feeds = pad_batch([ids for ids, _ in rows], pad, [types for _, types in rows])
    return torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["token_type_ids"])


def prepare_reranker(ctx: BuildContext[BertRerankerRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    prepared = prepare_encoder(ctx)
    tok = prepared.tokenizer
    pad = prepared.pad_id
    queries = ranking_queries(ctx.data_dir, "train", recipe.train_examples)
    queries = [q for q in queries if len(q.passages) > 1]
    log.info("bert-reranker: %d training questions, %d negatives each", len(queries), recipe.negatives)
    model = BertForPairRanking(copy.deepcopy(prepared.encoder))
    if prepared.pooler is not None:
        model.pooler.load_state_dict(prepared.pooler)
    encoder = model.encoder
    assert isinstance(encoder, BertEncoder)
    with torch.no_grad():  # the document's segment embedded as the query's: the checkpoint knew one segment
        types = encoder.embeddings.token_type_embeddings.weight
        types[1:] = types[0]
        model.term_weight.weight.copy_(torch.from_numpy(idf_weights(tok, queries, SPECIALS))[:, None])
    for frozen in [encoder.embeddings, *encoder.layers[: recipe.frozen_layers]]:
        frozen.requires_grad_(False)  # no gradient below the first trained layer: half a step's cost
    cache: dict[tuple[int, int], tuple[list[int], list[int]]] = {}

    def pair(qi: int, pi: int) -> tuple[list[int], list[int]]:
        if (qi, pi) not in cache:
            q = queries[qi]
            cache[qi, pi] = encode_pair(tok, q.question, q.passages[pi], recipe.max_len)
        return cache[qi, pi]

    lengths = [len(pair(i, q.relevant)[0]) for i, q in enumerate(queries)]

    def epoch(e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        chosen = groups(queries, recipe.negatives, e)
        for idx in length_bucketed(len(queries), lengths, recipe.batch_size, e):
            size = min(len(chosen[i]) for i in idx)  # one group size per batch
            ids, types = pad_rows([pair(i, p) for i in idx for p in chosen[i][:size]], pad)
            yield ids, types, torch.tensor(size)

    # The logit starts centred on the training pairs (the mean over a first batch is 0): the pointwise
    # loss then starts near its floor instead of pulling every similarity down at once.
    with torch.no_grad():
        ids, types, _ = next(epoch(ctx.seed + 1))
        model.shift.sub_(model(ids, (ids != pad).long(), types).mean())

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        ids, types, size = batch
        mask = (ids != pad).long()
        logits = m(ids, mask, types).view(-1, int(size))  # (questions, group): the own paragraph first
        target = torch.zeros(len(logits), dtype=torch.long)
        listwise = F.cross_entropy(logits, target)
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1.0
        pointwise = F.binary_cross_entropy_with_logits(logits, labels)
        return listwise + POINTWISE * pointwise, len(logits), int(mask.sum())

    def finish(result: TrainResult) -> Trained:
        manifest = _head_manifest(
            prepared,
            "rerank",
            {
                "description": "BERT cross-encoder: (query, passage) -> relevance, SQuAD passage ranking",
                "max_sequence_length": recipe.max_len,
                "ranking": {"score": "sigmoid", "candidates": recipe.candidates},
            },
        )
        training = {
            "data": "squad/train.json",
            "train_questions": len(queries),
            "negatives": recipe.negatives,
            "objective": "listwise softmax over the question's group + pointwise binary cross-entropy",
        }
        return Trained(ctx.name, model, tok, manifest, training, result)

    probe_queries = ranking_queries(ctx.data_dir, "validation", recipe.probe_limit or recipe.eval_limit)
    probe = Probe(
        "mrr_at_10",
        lambda m: reranker_measures(
            probe_queries, score_pairs(torch_run(m), tok, recipe.max_len, pad), recipe.candidates
        )["mrr_at_10"],
        f"{len(probe_queries):,} validation questions spread over the split, BM25's first "
        f"{recipe.candidates} paragraphs re-ordered",
        target=probes.TARGETS.get(ctx.name),
    )
    return _head_job(ctx, model, epoch, loss_fn, prepared, finish, probe)
