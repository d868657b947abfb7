"""Evaluate the exported models, through ONNX Runtime and the service's own pre/post-processing.

What is measured is what is served: the .onnx files from the model
repository, loaded and checked exactly as the service loads them, with the
service's QA windows, span search, entity grouping, image normalisation,
translation sources and step limits, and KV-cached translation decoding.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from service.engine.kv_cache import CacheLayout
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import logprobs
from service.engine.seq2seq import Seq2SeqModel
from service.engine.variants import VariantChoice
from service.pipelines.entity_spans import word_predictions
from service.pipelines.image_inputs import to_pixel_values
from service.pipelines.qa_spans import best_span, qa_windows
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate
from service.pipelines.translate import prepare_source

from . import ranking, scoring
from .data import (
    SST2_LABELS,
    SquadExample,
    TaggedSentence,
    load_conll,
    load_fashion_mnist,
    load_multi30k,
    load_squad,
    load_sst2,
    load_tinyshakespeare,
)

log = logging.getLogger(__name__)

# A graph's forward pass: feeds by input name -> its outputs in order (an ONNX Runtime graph's `run`,
# or a torch module's during training, `probes.torch_run`).
Run = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]

METRIC_KEYS = {
    "translator": ["bleu", "chrf"],
    "bert-classifier": ["accuracy"],
    "bert-qa": ["exact_match", "f1"],
    "bert-tagger": ["entity_f1"],
    "bert-embedder": ["centroid_accuracy", "cosine_gap"],
    "bert-reranker": ["mrr_at_10", "accuracy_at_1"],
    "gpt": ["bits_per_char"],
    "vit": ["accuracy"],
}


# SST-2 training sentences whose per-label mean embeddings the embedder's evaluation classifies by.
CENTROID_EXAMPLES = 2000


def _batches(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _limit(items: Any, limit: int | None) -> Any:
    return items if limit is None else items[:limit]


def evaluate_translator(
    model: LoadedModel, data_dir: Path, split: str, limit: int | None, beam_size: int
) -> dict:
    pairs = _limit(load_multi30k(data_dir, split), limit)
    tok = model.tokenizer
    assert tok is not None
    seq2seq = Seq2SeqModel(
        model.graphs["encoder"], model.graphs["decoder"], model.manifest, model.inplace.get("decoder")
    )
    # The served sources and default step limits; like the service's batches, one decoding call per limit.
    prepared = [
        prepare_source(model.manifest, e.ids, seq2seq.max_new_tokens)
        for e in tok.encode_batch([en for en, _ in pairs])
    ]
    by_limit: dict[int, list[int]] = {}
    for i in sorted(
        range(len(prepared)), key=lambda i: len(prepared[i][0])
    ):  # similar lengths batch together
        by_limit.setdefault(prepared[i][1], []).append(i)
    hyps: dict[int, str] = {}
    for limit_new, members in by_limit.items():
        for chunk in _batches(len(members), 32 if beam_size == 1 else 16):
            idx = [members[i] for i in chunk]
            batch = [prepared[i][0] for i in idx]
            if beam_size == 1:
                out = [h.tokens for h in seq2seq.greedy(batch, limit_new)]
            else:
                out = [
                    r[0].tokens for r in seq2seq.beam_search(batch, beam_size, limit_new, length_penalty=1.0)
                ]
            for i, ids in zip(idx, out, strict=True):
                hyps[i] = tok.decode(ids, skip_special_tokens=True)
    hypotheses = [hyps[i] for i in range(len(pairs))]
    return {
        "bleu": scoring.corpus_bleu(hypotheses, [de for _, de in pairs]),
        "chrf": scoring.corpus_chrf(hypotheses, [de for _, de in pairs]),
        "decoding": "greedy" if beam_size == 1 else f"beam {beam_size}, length penalty 1.0",
        "samples": [
            {"source": pairs[i][0], "reference": pairs[i][1], "hypothesis": hypotheses[i]} for i in range(3)
        ],
    }


def _encoder(model: LoadedModel) -> tuple[Tokenizer, int, int]:
    """A BERT head's tokenizer, window length and [PAD] id."""
    assert model.tokenizer is not None
    return model.tokenizer, required(model.manifest.max_sequence_length), model.manifest.token("pad")


def evaluate_classifier(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    rows = _limit(load_sst2(data_dir, split), limit)
    return {"accuracy": classifier_accuracy(model.graphs["model"].run, *_encoder(model), rows)}


def classifier_accuracy(
    run: Run, tok: Tokenizer, max_len: int, pad: int, rows: list[tuple[str, int]]
) -> float:
    """The share of (text, label) rows whose argmax logit is the label, through ``run``."""
    encoded = [truncate(e.ids, max_len) for e in tok.encode_batch([t for t, _ in rows])]
    correct = 0
    order = sorted(range(len(rows)), key=lambda i: len(encoded[i]))  # similar lengths batch together
    for chunk in _batches(len(order), 64):
        idx = [order[k] for k in chunk]
        logits = run(pad_batch([encoded[i] for i in idx], pad))[0]
        correct += int((logits.argmax(-1) == np.array([rows[i][1] for i in idx])).sum())
    return correct / len(rows)


def evaluate_qa(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    examples = _limit(load_squad(data_dir, split), limit)
    qa = required(model.manifest.qa)
    spans = QaSpans(qa.stride, qa.max_question_length, qa.max_answer_length)
    return qa_scores(model.graphs["model"].run, *_encoder(model), spans, examples)


@dataclass(frozen=True)
class QaSpans:
    """How a QA head reads a context: windows of the head's length by ``stride``, and its longest answer."""

    stride: int
    max_question_length: int
    max_answer_length: int


def qa_scores(
    run: Run, tok: Tokenizer, max_len: int, pad: int, spans: QaSpans, examples: list[SquadExample]
) -> dict:
    """SQuAD exact match and F1 (0-100) over ``examples``, with the service's windows and span search.

    Every example's windows go through the graph together, 32 of similar length at a time (a row's
    logits do not depend on its batch, and the span search reads only a window's own tokens), then
    each example's best span is searched over its own windows, as the service does.
    """
    windows = [
        qa_windows(tok, ex.question, ex.context, max_len, spans.stride, spans.max_question_length)
        for ex in examples
    ]
    flat = [w for ws in windows for w in ws]
    starts: list[np.ndarray] = [np.empty(0)] * len(flat)
    ends: list[np.ndarray] = [np.empty(0)] * len(flat)
    order = sorted(range(len(flat)), key=lambda i: len(flat[i].input_ids))
    for chunk in _batches(len(order), 32):
        idx = [order[k] for k in chunk]
        feeds = pad_batch([flat[i].input_ids for i in idx], pad, [flat[i].token_type_ids for i in idx])
        start_logits, end_logits = run(feeds)
        for row, i in enumerate(idx):
            starts[i], ends[i] = start_logits[row], end_logits[row]
    predictions: dict[str, str] = {}
    first = 0
    for ex, ws in zip(examples, windows, strict=True):
        last = first + len(ws)
        span = best_span(ws, starts[first:last], ends[first:last], spans.max_answer_length)
        predictions[ex.id] = ex.context[span.start : span.end] if span else ""
        first = last
    scores = scoring.squad_scores(predictions, examples)
    return {**scores, "windows": len(flat)}


def evaluate_tagger(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    sentences = _limit(load_conll(data_dir, split), limit)
    labels = required(model.manifest.labels)
    return tagger_scores(model.graphs["model"].run, *_encoder(model), labels, sentences)


def tagger_scores(
    run: Run, tok: Tokenizer, max_len: int, pad: int, labels: list[str], sentences: list[TaggedSentence]
) -> dict:
    """Entity F1, precision and recall over ``sentences``: each word tagged from its first sub-token."""
    encodings = tok.encode_batch([s.tokens for s in sentences], is_pretokenized=True)
    predicted: list[list[str]] = [[] for _ in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(encodings[i].ids))  # similar lengths batch
    for chunk in _batches(len(order), 64):
        idx = [order[k] for k in chunk]
        rows = [truncate(encodings[i].ids, max_len) for i in idx]
        logits = run(pad_batch(rows, pad))[0]
        for j, i in enumerate(idx):
            word_ids = encodings[i].word_ids[: len(rows[j])]
            tags, _ = word_predictions(logits[j, : len(rows[j])], word_ids, labels)
            n = len(sentences[i].tokens)
            predicted[i] = (tags + ["O"] * n)[:n]  # words cut by truncation count as O
    scores = scoring.entity_f1([s.tags for s in sentences], predicted)
    return {
        "entity_f1": scores["f1"],
        "entity_precision": scores["precision"],
        "entity_recall": scores["recall"],
    }


def embed(model: LoadedModel, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """(N, D) L2-normalised sentence embeddings through the graph, batched by length as the service pads."""
    tok, max_len, pad = _encoder(model)
    spec = required(model.manifest.embedding)
    rows = [truncate(e.ids, max_len) for e in tok.encode_batch(texts)]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = np.zeros((len(rows), spec.dimensions), dtype=np.float32)
    for chunk in _batches(len(order), batch_size):
        idx = [order[i] for i in chunk]
        feeds = pad_batch([rows[i] for i in idx], pad)
        out[idx] = model.graphs["model"].run(feeds, [spec.normalized_output])[0]
    return out


def evaluate_embedder(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    """Two label-aware figures on SST-2 sentiment, with nothing trained on top of the embeddings.

    ``centroid_accuracy``: each sentence gets the label whose centroid (the mean embedding of that
    label's sentences among the first ``CENTROID_EXAMPLES`` of the training split) is nearest by
    cosine. ``cosine_gap``: the mean cosine of same-label pairs minus that of different-label pairs
    among the evaluated sentences. Embeddings that know nothing of sentiment score about 0.5 and 0.
    """
    rows = _limit(load_sst2(data_dir, split), limit)
    train_rows = load_sst2(data_dir, "train")[:CENTROID_EXAMPLES]
    emb = embed(model, [t for t, _ in rows])
    labels = np.array([y for _, y in rows])
    train_emb = embed(model, [t for t, _ in train_rows])
    train_labels = np.array([y for _, y in train_rows])
    centroids = np.stack([train_emb[train_labels == k].mean(0) for k in range(len(SST2_LABELS))])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    accuracy = float(((emb @ centroids.T).argmax(1) == labels).mean())
    cosine = emb @ emb.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(rows), dtype=bool)
    gap = float(cosine[same & off_diagonal].mean() - cosine[~same].mean())
    return {"centroid_accuracy": accuracy, "cosine_gap": gap, "centroid_examples": len(train_rows)}


def evaluate_reranker(
    model: LoadedModel, models_dir: Path, data_dir: Path, split: str, limit: int | None
) -> dict:
    """SQuAD passage ranking (``ranking.py``): the reranker re-ordering BM25's first candidates, beside
    BM25 alone and, when it is built beside it, the house embedder's cosine, on the same questions."""
    tok, max_len, pad = _encoder(model)
    candidates = int((model.manifest.model_extra or {}).get("ranking", {}).get("candidates", 20))
    queries = ranking.ranking_queries(data_dir, split, limit)
    graph = model.graphs["model"]
    score = ranking.score_pairs(lambda feeds: graph.run(feeds_for(graph, feeds)), tok, max_len, pad)
    result: dict[str, Any] = {
        **ranking.reranker_measures(queries, score, candidates),
        "candidates": candidates,
        "baselines": {"bm25": ranking.bm25_measures(queries)},
    }
    if (models_dir / "bert-embedder" / "manifest.json").is_file():
        embedder = load_model(models_dir / "bert-embedder", RuntimeOptions(device="cpu"))
        result["baselines"]["embedder_cosine"] = ranking.cosine_measures(
            queries, lambda texts: embed(embedder, texts)
        )
    return result


def evaluate_gpt(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    text = load_tinyshakespeare(data_dir, split)
    if limit is not None:
        text = text[:limit]
    tok = model.tokenizer
    assert tok is not None
    layout = CacheLayout.of(required(model.manifest.kv_cache))
    empty = dict(zip(layout.past_names, layout.empty(1), strict=True))

    def logits(chunk: np.ndarray) -> np.ndarray:
        feeds = {
            "input_ids": chunk[None, :],
            "attention_mask": np.ones((1, len(chunk)), dtype=np.int64),
            "position_ids": np.arange(len(chunk), dtype=np.int64)[None, :],
            **empty,
        }
        return model.graphs["model"].run(feeds, ["logits"])[0][0]

    return text_bits_per_char(logits, tok, text, required(model.manifest.max_sequence_length))


def text_bits_per_char(
    logits: Callable[[np.ndarray], np.ndarray], tok: Tokenizer, text: str, window: int
) -> dict:
    """Bits per character: summed token NLL over the text / characters those tokens cover.

    ``logits(ids)`` scores one window of token ids, (T,) -> (T, V). Sliding windows of
    ``window`` tokens, each scoring only the tokens the previous window did not, so every token
    but the first is predicted with as much context as fits.
    """
    enc = tok.encode(text)
    ids = np.array(enc.ids, dtype=np.int64)
    stride = window // 2
    nll, scored_from = 0.0, 1
    starts = list(range(0, max(1, len(ids) - 1), stride))
    for start in starts:
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        lp = logprobs(logits(chunk))  # (T, V)
        targets = np.arange(start + 1, start + len(chunk))  # absolute positions predicted here
        fresh = targets >= scored_from
        rows = targets[fresh] - start - 1
        nll -= float(lp[rows, ids[targets[fresh]]].sum())
        scored_from = start + len(chunk)
        if start + window >= len(ids):
            break
    first_token_chars = enc.offsets[0][1] if enc.offsets else 0
    chars = len(text) - first_token_chars
    return {"bits_per_char": scoring.bits_per_char(nll, chars), "tokens": len(ids), "characters": len(text)}


def evaluate_vit(model: LoadedModel, data_dir: Path, split: str, limit: int | None) -> dict:
    images, labels = load_fashion_mnist(data_dir, split)
    images, labels = _limit(images, limit), _limit(labels, limit)
    pre = required(model.manifest.preprocessing)
    correct = 0
    for chunk in _batches(len(images), 256):
        logits = model.graphs["model"].run(
            {"pixel_values": to_pixel_values(images[chunk.start : chunk.stop], pre)}
        )[0]
        correct += int((logits.argmax(-1) == labels[chunk.start : chunk.stop]).sum())
    return {"accuracy": correct / len(images)}


def evaluate_model(
    models_dir: Path,
    name: str,
    data_dir: Path,
    split: str,
    limit: int | None = None,
    beam_size: int = 4,
    variant: VariantChoice = "reference",
    device: Literal["cpu", "cuda"] = "cpu",
) -> dict[str, Any]:
    """The model's metrics on ``split``, computed on its ``variant`` graphs (the reference by default)."""
    model = load_model(models_dir / name, RuntimeOptions(device=device, variant=variant))
    evaluators: dict[str, Callable[[], dict]] = {
        "translation": lambda: evaluate_translator(model, data_dir, split, limit, beam_size),
        "text-classification": lambda: evaluate_classifier(model, data_dir, split, limit),
        "question-answering": lambda: evaluate_qa(model, data_dir, split, limit),
        "token-classification": lambda: evaluate_tagger(model, data_dir, split, limit),
        "text-generation": lambda: evaluate_gpt(model, data_dir, split, limit),
        "image-classification": lambda: evaluate_vit(model, data_dir, split, limit),
        "feature-extraction": lambda: evaluate_embedder(model, data_dir, split, limit),
        "rerank": lambda: evaluate_reranker(model, models_dir, data_dir, split, limit),
    }
    start = time.perf_counter()
    result = evaluators[model.task]()
    seconds = time.perf_counter() - start
    examples = _count_examples(model.task, data_dir, split, limit)
    result = {
        **result,
        "examples": examples,
        "seconds": round(seconds, 2),
        "split": split,
        "version": model.version,
    }
    for key, value in result.items():
        if isinstance(value, float) and math.isfinite(value):
            result[key] = round(value, 4)
    return result


def _count_examples(task: str, data_dir: Path, split: str, limit: int | None) -> int:
    counts: dict[str, Callable[[], int]] = {
        "translation": lambda: len(load_multi30k(data_dir, split)),
        "text-classification": lambda: len(load_sst2(data_dir, split)),
        "question-answering": lambda: len(load_squad(data_dir, split)),
        "token-classification": lambda: len(load_conll(data_dir, split)),
        "text-generation": lambda: len(load_tinyshakespeare(data_dir, split)),
        "image-classification": lambda: len(load_fashion_mnist(data_dir, split)[1]),
        "feature-extraction": lambda: len(load_sst2(data_dir, split)),
        "rerank": lambda: len(load_squad(data_dir, split)),
    }
    total = counts[task]()
    return total if limit is None else min(total, limit)
