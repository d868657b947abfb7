"""bert-classifier, bert-qa, bert-tagger, bert-embedder: four heads on one BERT encoder, four single-graph exports.

The encoder (`bert_encoder.py`: the checkpoint, or masked-LM pretraining) is prepared once per run
and copied into each head. The classifier, QA span head and tagger are fine-tuned; the embedder
trains nothing: all-MiniLM-L6-v2 is already a sentence encoder, and the masked-LM fallback is used
as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from service.pipelines import text_inputs
from service.pipelines.qa_spans import answer_token_span, qa_windows
from service.pipelines.text_inputs import truncate

from ..data import CONLL_LABELS, SST2_LABELS, load_conll, load_squad, load_sst2
from ..models.bert import (
    BertEncoder,
    BertForQuestionAnswering,
    BertForSentenceEmbedding,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from ..onnx_export import GraphSpec, auto_dims
from ..profiles import BertEmbedderRecipe, BertHeadRecipe, BertQaRecipe
from ..training import Probe, TrainResult, infinite
from . import probes
from .bert_encoder import IGNORE, PreparedEncoder, prepare_encoder
from .common import BuildContext, LossFn, Trained, TrainingJob
from .signatures import BERT_INPUTS, bert_feed

log = logging.getLogger(__name__)

HeadRecipe = TypeVar("HeadRecipe", bound=BertHeadRecipe)


def set_dropout(model: nn.Module, p: float) -> None:
    """Fine-tuning budgets here are under one epoch: dropout would only slow convergence (and costs 15% of a step)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p


def pad_batch(rows: list[list[int]], pad: int) -> torch.Tensor:
    """Right-padded (B, longest) rows as a long tensor: the service's own padding."""
    return torch.from_numpy(text_inputs.pad_batch(rows, pad)["input_ids"])


def length_bucketed(n: int, lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Batches of similar length (less padding), in random order."""
    rng = random.Random(seed)
    order = sorted(range(n), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    rng.shuffle(batches)
    return batches


def bert_graph(module: nn.Module, outputs: dict[str, list[str | int]], vocab: int, seed: int) -> GraphSpec:
    rng = np.random.default_rng(seed)
    example = bert_feed(rng, vocab, 2, 9)
    return GraphSpec(
        file="model.onnx",
        module=module,
        example_args=tuple(torch.from_numpy(example[k]) for k in BERT_INPUTS),
        input_axes={k: ["batch", "sequence"] for k in BERT_INPUTS},
        output_axes=outputs,
        dynamic_shapes=tuple(auto_dims([0, 1]) for _ in BERT_INPUTS),
        parity_inputs=[bert_feed(rng, vocab, 1, 12), bert_feed(rng, vocab, 4, 7)],
    )


def _head_manifest(prepared: PreparedEncoder, task: str, extra: dict[str, Any]) -> dict[str, Any]:
    tok = prepared.tokenizer
    return {
        "task": task,
        "architecture": "bert",
        "config": dataclasses.asdict(prepared.encoder.config),
        "special_tokens": {
            t.strip("[]").lower(): tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
        },
        "encoder": prepared.origin,
        **extra,
    }


def _head_job(
    ctx: BuildContext[HeadRecipe],
    model: nn.Module,
    epoch: Callable[[int], Iterator[Any]],
    loss_fn: LossFn,
    prepared: PreparedEncoder,
    finish: Callable[[TrainResult], Trained],
    probe: Probe,
) -> TrainingJob:
    """`epoch(e)` yields epoch e's batches in an order seeded by e (the job offsets e by its seed)."""
    set_dropout(model, ctx.recipe.dropout)
    # The 30k x D word-embedding matrix gets a dense gradient and an AdamW update every step:
    # a fixed cost that a sub-epoch fine-tuning run does not repay. The pretrained vectors stay.
    encoder = model.encoder
    assert isinstance(encoder, BertEncoder)
    encoder.embeddings.word_embeddings.weight.requires_grad_(False)

    def finish_with_curves(result: TrainResult) -> Trained:
        prepared.save_pretraining_curve(ctx.work_dir)
        return finish(result)

    def batches(seed: int) -> Iterator[Any]:
        return infinite(lambda e: epoch(seed + e))

    return TrainingJob(ctx, model, batches, loss_fn, "tokens", finish_with_curves, probe)


def prepare_classifier(ctx: BuildContext[BertHeadRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    prepared = prepare_encoder(ctx)
    tok = prepared.tokenizer
    rows = load_sst2(ctx.data_dir, "train")[: recipe.train_examples]
    encoded = [truncate(e.ids, recipe.max_len) for e in tok.encode_batch([t for t, _ in rows])]
    labels = torch.tensor([y for _, y in rows])
    model = BertForSequenceClassification(copy.deepcopy(prepared.encoder), num_labels=len(SST2_LABELS))
    if prepared.pooler is not None:
        model.pooler.load_state_dict(prepared.pooler)
    pad = prepared.pad_id

    def epoch(e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in length_bucketed(len(encoded), [len(x) for x in encoded], recipe.batch_size, e):
            yield pad_batch([encoded[i] for i in idx], pad), labels[idx]

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        ids, y = batch
        mask = (ids != pad).long()
        return F.cross_entropy(m(ids, mask, torch.zeros_like(ids)), y), len(y), int(mask.sum())

    def finish(result: TrainResult) -> Trained:
        manifest = _head_manifest(
            prepared,
            "text-classification",
            {
                "description": "BERT [CLS] classifier, SST-2 sentiment",
                "labels": SST2_LABELS,
                "max_sequence_length": recipe.max_len,
            },
        )
        training = {"data": "sst2/train.tsv", "train_examples": len(rows)}
        return Trained(ctx.name, model, tok, manifest, training, result)

    probe = probes.classifier(ctx.name, recipe, ctx.data_dir, tok, pad)
    return _head_job(ctx, model, epoch, loss_fn, prepared, finish, probe)


def prepare_qa(ctx: BuildContext[BertQaRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    prepared = prepare_encoder(ctx)
    tok = prepared.tokenizer
    examples = load_squad(ctx.data_dir, "train")[: recipe.train_examples]
    # Training windows are shorter than serving windows (compute on 2 cores is the limit) and are mostly
    # ones that contain the answer; a few answer-less ones teach the head to prefer [CLS] there.
    rng = random.Random(ctx.seed)
    features: list[tuple[list[int], list[int], int, int]] = []
    for ex in examples:
        answer_start, answer_text = ex.answers[0]
        windows = qa_windows(
            tok, ex.question, ex.context, recipe.train_max_len, recipe.train_stride, recipe.max_question_len
        )
        for window in windows:
            span = answer_token_span(window, answer_start, answer_start + len(answer_text))
            if span is None and rng.random() >= recipe.negative_fraction:
                continue
            start, end = span if span is not None else (0, 0)  # no answer in this window: point at [CLS]
            features.append((window.input_ids, window.token_type_ids, start, end))
    log.info("bert-qa: %d questions -> %d training windows", len(examples), len(features))
    model = BertForQuestionAnswering(copy.deepcopy(prepared.encoder))
    pad = prepared.pad_id

    def epoch(e: int) -> Iterator[tuple[torch.Tensor, ...]]:
        for idx in length_bucketed(len(features), [len(f[0]) for f in features], recipe.batch_size, e):
            batch = [features[i] for i in idx]
            yield (
                pad_batch([f[0] for f in batch], pad),
                pad_batch([f[1] for f in batch], 0),
                torch.tensor([f[2] for f in batch]),
                torch.tensor([f[3] for f in batch]),
            )

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, ...]):  # type: ignore[no-untyped-def]
        ids, types, starts, ends = batch
        mask = (ids != pad).long()
        start_logits, end_logits = m(ids, mask, types)
        loss = (F.cross_entropy(start_logits, starts) + F.cross_entropy(end_logits, ends)) / 2
        return loss, len(ids), int(mask.sum())

    def finish(result: TrainResult) -> Trained:
        manifest = _head_manifest(
            prepared,
            "question-answering",
            {
                "description": "BERT span head over (question, context), SQuAD v1.1",
                "max_sequence_length": recipe.max_len,
                "qa": {
                    "stride": recipe.stride,
                    "max_question_length": recipe.max_question_len,
                    "max_answer_length": recipe.max_answer_len,
                },
            },
        )
        training = {
            "data": "squad/train.json",
            "train_questions": len(examples),
            "train_windows": len(features),
        }
        return Trained(ctx.name, model, tok, manifest, training, result)

    probe = probes.qa(ctx.name, recipe, ctx.data_dir, tok, pad)
    return _head_job(ctx, model, epoch, loss_fn, prepared, finish, probe)


def encode_tagged(
    tok: Tokenizer, tokens: list[str], tags: list[str] | None, max_len: int
) -> tuple[list[int], list[int]]:
    """Word-level tags -> ids and labels on each word's first sub-token (others ignored), truncated to max_len."""
    enc = tok.encode(tokens, is_pretokenized=True)
    ids, word_ids = enc.ids, enc.word_ids
    if len(ids) > max_len:
        ids, word_ids = truncate(ids, max_len), [*word_ids[: max_len - 1], None]
    labels, seen = [], set()
    for w in word_ids:
        if w is None or w in seen or tags is None:
            labels.append(IGNORE)
        else:
            seen.add(w)
            labels.append(CONLL_LABELS.index(tags[w]))
    return ids, labels


def prepare_tagger(ctx: BuildContext[BertHeadRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    prepared = prepare_encoder(ctx)
    tok = prepared.tokenizer
    sentences = load_conll(ctx.data_dir, "train")[: recipe.train_examples]
    encoded = [encode_tagged(tok, sent.tokens, sent.tags, recipe.max_len) for sent in sentences]
    model = BertForTokenClassification(copy.deepcopy(prepared.encoder), num_labels=len(CONLL_LABELS))
    pad = prepared.pad_id

    def epoch(e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in length_bucketed(len(encoded), [len(x[0]) for x in encoded], recipe.batch_size, e):
            yield (
                pad_batch([encoded[i][0] for i in idx], pad),
                pad_batch([encoded[i][1] for i in idx], IGNORE),
            )

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        ids, labels = batch
        mask = (ids != pad).long()
        logits = m(ids, mask, torch.zeros_like(ids))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE)
        return loss, len(ids), int(mask.sum())

    def finish(result: TrainResult) -> Trained:
        manifest = _head_manifest(
            prepared,
            "token-classification",
            {
                "description": "BERT per-token BIO tagger, CoNLL-2003 English NER (IOB1 converted to BIO)",
                "labels": CONLL_LABELS,
                "max_sequence_length": recipe.max_len,
                "tagging": {"scheme": "BIO", "label_on": "first sub-token of each word"},
            },
        )
        training = {"data": "conll2003/train.txt", "train_sentences": len(sentences)}
        return Trained(ctx.name, model, tok, manifest, training, result)

    probe = probes.tagger(ctx.name, recipe, ctx.data_dir, tok, pad, CONLL_LABELS)
    return _head_job(ctx, model, epoch, loss_fn, prepared, finish, probe)


def prepare_embedder(ctx: BuildContext[BertEmbedderRecipe]) -> TrainingJob:
    """The shared encoder with mean pooling and L2 normalisation: a job of no steps (nothing is trained)."""
    recipe = ctx.recipe
    prepared = prepare_encoder(ctx)
    model = BertForSentenceEmbedding(copy.deepcopy(prepared.encoder)).eval()
    config = prepared.encoder.config
    checkpoint = prepared.origin.get("init_from") is not None

    def finish(result: TrainResult) -> Trained:
        prepared.save_pretraining_curve(ctx.work_dir)
        origin = (
            "the checkpoint's own sentence-embedding training"
            if checkpoint
            else (
                "none at sentence level: the masked-LM encoder as it is (no checkpoint was available), "
                "so its embeddings are far weaker than all-MiniLM-L6-v2's"
            )
        )
        manifest = _head_manifest(
            prepared,
            "feature-extraction",
            {
                "description": "BERT sentence embedder: mean pooling over real tokens, L2-normalised; "
                + ("the checkpoint's encoder" if checkpoint else "the masked-LM encoder (no checkpoint)"),
                "max_sequence_length": min(recipe.max_len, config.max_position),
                "embedding": {
                    "dimensions": config.hidden_size,
                    "pooling": "mean",
                    "normalized_output": "sentence_embedding",
                    "pooled_output": "mean_pooled",
                },
            },
        )
        training = {"data": None, "objective": origin}
        return Trained(ctx.name, model, prepared.tokenizer, manifest, training, result)

    def no_loss(m: nn.Module, batch: Any) -> tuple[torch.Tensor, int, int]:
        raise AssertionError("bert-embedder has no training steps")

    return TrainingJob(ctx, model, lambda seed: iter(()), no_loss, "tokens", finish)


def graphs(trained: Trained, seed: int) -> dict[str, GraphSpec]:
    """One graph (input_ids, attention_mask, token_type_ids) -> the head's outputs, axes named per task."""
    assert trained.tokenizer is not None
    task = trained.manifest["task"]
    labels = len(trained.manifest.get("labels", []))
    dimensions = trained.manifest.get("embedding", {}).get("dimensions", 0)
    outputs_by_task: dict[str, dict[str, list[str | int]]] = {
        "text-classification": {"logits": ["batch", labels]},
        "rerank": {"logits": ["batch", 1]},
        "question-answering": {"start_logits": ["batch", "sequence"], "end_logits": ["batch", "sequence"]},
        "token-classification": {"logits": ["batch", "sequence", labels]},
        "feature-extraction": {
            "sentence_embedding": ["batch", dimensions],  # L2-normalised
            "mean_pooled": ["batch", dimensions],  # the same before normalisation
        },
    }
    outputs = outputs_by_task[task]
    return {"model": bert_graph(trained.model, outputs, trained.tokenizer.get_vocab_size(), seed)}
