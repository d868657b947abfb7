"""How an imported model's variants are judged: on the user's labelled examples, or by agreement with the reference.

The variants stage (``variants.build_variants``) is the build's: fused, int8 and fp16, each checked for
parity and batch independence and held to the accuracy rule. What it measures differs:

- ``--data FILE`` (JSON lines, the user's labelled examples): the task's own metric, computed with the
  house's scoring code on the served graphs (``evaluate.py``): accuracy (``{"text", "label"}``; images
  ``{"image": path, "label"}``), entity F1 (``{"tokens", "tags"}``), SQuAD F1 (``{"question", "context",
  "answers": [{"text", "answer_start"}]}``), bits per character (``{"text"}``), BLEU (``{"source",
  "target"}``), centroid accuracy of embeddings (``{"text", "label"}``), a cross-encoder's MRR@10 over
  each query's documents (``{"query", "documents": [...], "relevant": index}``); the rule is the house's.
- no data: ``agreement``, the share of inputs on which the variant answers exactly as the reference
  graphs do (the same label, entities, span, greedy tokens; for embeddings, the same nearest other
  input by cosine, retrieval's answer; for a cross-encoder, the same top-ranked document of a query's
  candidates: SQuAD validation questions against BM25's first paragraphs of their article), on the
  shared data's validation inputs where they are there, else the import's sample texts; a variant may
  disagree on at most 1 in 100 (``variants.RULES["agreement"]``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.seq2seq import Seq2SeqModel
from service.engine.variants import VariantChoice
from service.pipelines.entity_spans import group_entities, token_predictions
from service.pipelines.image_inputs import image_pixels, open_image, to_pixel_values
from service.pipelines.qa_spans import best_span, qa_windows
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate
from service.pipelines.translate import prepare_source

from .. import evaluate, ranking, scoring
from ..data import SquadExample, TaggedSentence
from ..variants import Scorer, build_variants
from .checkpoint import Checkpoint, ImportRefused
from .checks import QUESTIONS
from .tokenizer import SAMPLE_TEXTS

log = logging.getLogger(__name__)

# task -> the fields each example of --data needs
FIELDS = {
    "text-classification": ("text", "label"),
    "token-classification": ("tokens", "tags"),
    "question-answering": ("question", "context", "answers"),
    "feature-extraction": ("text", "label"),
    "rerank": ("query", "documents", "relevant"),
    "text-generation": ("text",),
    "translation": ("source", "target"),
    "image-classification": ("image", "label"),
}
AGREEMENT_TEXTS = 200  # inputs agreement is measured on (encoders); decoders take fewer, each decoded
AGREEMENT_QUERIES = 100  # a cross-encoder's: queries, each against its RERANK_CANDIDATES documents
RERANK_CANDIDATES = 10
DECODED_TEXTS = 24
NEW_TOKENS = 12


def read_examples(path: Path, task: str) -> list[dict[str, Any]]:
    """``--data``: one JSON object per line, with the task's fields (``FIELDS``); refused with the line."""
    if not path.is_file():
        raise ImportRefused(f"--data {path}: no such file")
    examples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except ValueError as exc:
            raise ImportRefused(f"--data {path} line {number}: not JSON ({exc})") from exc
        missing = [f for f in FIELDS[task] if not isinstance(example, dict) or f not in example]
        if missing:
            raise ImportRefused(f"--data {path} line {number}: {task} examples need {', '.join(missing)}")
        if task == "rerank":
            _check_ranked(example, f"--data {path} line {number}")
        if task == "image-classification":
            image = Path(example["image"])
            example["image"] = str(image if image.is_absolute() else path.parent / image)
        examples.append(example)
    if not examples:
        raise ImportRefused(f"--data {path} holds no example")
    return examples


def _check_ranked(example: dict[str, Any], where: str) -> None:
    """A rerank example: a query, a non-empty list of documents, and the relevant one's index among them."""
    documents = example["documents"]
    if not isinstance(example["query"], str):
        raise ImportRefused(f"{where}: query is not a string")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise ImportRefused(f"{where}: documents is not a non-empty list of strings")
    relevant = example["relevant"]
    if isinstance(relevant, bool) or not isinstance(relevant, int) or not 0 <= relevant < len(documents):
        raise ImportRefused(
            f"{where}: relevant is {relevant!r}, not an index into its {len(documents)} documents"
        )


def source_texts(examples: list[dict[str, Any]] | None) -> list[str]:
    """The texts a tokenizer conversion is also checked on: the sources the user will send."""
    texts: list[str] = []
    for example in examples or []:
        for key in ("text", "question", "context", "source", "query"):
            if isinstance(example.get(key), str):
                texts.append(example[key])
        texts.extend(d for d in example.get("documents") or [] if isinstance(d, str))
    return texts[:1000]


def _ranked_inputs() -> list[tuple[str, list[str]]]:
    """A cross-encoder's agreement inputs: SQuAD validation questions, each against BM25's first
    paragraphs of its article (retrieve, then rerank); else the check's questions against the sample texts."""
    from ..data import resolve_data_dir

    try:
        queries = ranking.ranking_queries(resolve_data_dir(None), "validation", AGREEMENT_QUERIES)
    except (FileNotFoundError, OSError, SystemExit):
        return [(q, list(SAMPLE_TEXTS)) for q in QUESTIONS]
    return [(q.question, [q.passages[i] for i in q.bm25[:RERANK_CANDIDATES]]) for q in queries]


def _inputs(checkpoint: Checkpoint) -> list[Any]:
    """Agreement's inputs: the shared data's validation texts of the task's kind where they are here."""
    from ..data import load_multi30k, load_squad, load_sst2, load_tinyshakespeare, resolve_data_dir

    if checkpoint.task == "rerank":
        return _ranked_inputs()
    try:
        data_dir = resolve_data_dir(None)
        if checkpoint.task == "translation":
            texts = [en for en, _ in load_multi30k(data_dir, "validation")]
        elif checkpoint.task == "text-generation":
            text = load_tinyshakespeare(data_dir, "validation")
            texts = [text[i : i + 80] for i in range(0, 80 * DECODED_TEXTS, 80)]
        elif checkpoint.task == "question-answering":
            texts = [f"{e.question}\n{e.context}" for e in load_squad(data_dir, "validation")]
        else:
            texts = [t for t, _ in load_sst2(data_dir, "validation")]
    except (FileNotFoundError, OSError, SystemExit):
        texts = list(SAMPLE_TEXTS)
    limit = DECODED_TEXTS if checkpoint.task in ("translation", "text-generation") else AGREEMENT_TEXTS
    return texts[:limit]


def _encoder_rows(model: LoadedModel, texts: list[str]) -> list[list[int]]:
    assert model.tokenizer is not None
    window = required(model.manifest.max_sequence_length)
    return [truncate(e.ids, window) for e in model.tokenizer.encode_batch(texts)]


def _run_rows(
    model: LoadedModel, rows: list[list[int]], outputs: list[str] | None = None
) -> list[np.ndarray]:
    """One output per row (its own length), batches of 32 as the service pads them."""
    graph = model.graphs["model"]
    got: list[list[np.ndarray]] = []
    for i in range(0, len(rows), 32):
        chunk = rows[i : i + 32]
        feeds = pad_batch(chunk, model.manifest.token("pad"))
        out = graph.run({k: feeds[k] for k in graph.input_names}, outputs)
        got.extend([o[j] for o in out] for j in range(len(chunk)))
    return [g[0] for g in got]


def _pair_scores(model: LoadedModel) -> ranking.ScorePairs:
    """(query, document) pairs -> the cross-encoder's logits, encoded and cut as the service does."""
    tok, max_len, pad = evaluate._encoder(model)
    graph = model.graphs["model"]
    return ranking.score_pairs(lambda feeds: graph.run(feeds_for(graph, feeds)), tok, max_len, pad)


def _top_documents(model: LoadedModel, queries: list[tuple[str, list[str]]]) -> list[int]:
    """Each query's top-ranked document (its index among the query's documents)."""
    scores = _pair_scores(model)([(q, d) for q, documents in queries for d in documents])
    tops, at = [], 0
    for _, documents in queries:
        tops.append(int(np.argmax(scores[at : at + len(documents)])))
        at += len(documents)
    return tops


def _answers(model: LoadedModel, checkpoint: Checkpoint, texts: list[Any]) -> list[Any]:
    """What the model answers for each input, in a form compared for equality (embeddings: vectors)."""
    task = checkpoint.task
    if task == "rerank":
        return _top_documents(model, texts)
    if task == "text-classification":
        return [int(o.argmax()) for o in _run_rows(model, _encoder_rows(model, texts))]
    if task == "feature-extraction":
        spec = required(model.manifest.embedding)
        return _run_rows(model, _encoder_rows(model, texts), [spec.normalized_output])
    if task == "token-classification":
        assert model.tokenizer is not None
        labels = required(model.manifest.labels)
        rows = _encoder_rows(model, texts)
        logits = _run_rows(model, rows)
        answers = []
        for row, lg, enc in zip(rows, logits, model.tokenizer.encode_batch(texts), strict=True):
            n = len(row)
            tags, scores, spans = token_predictions(
                lg[:n], list(enc.word_ids)[:n], list(enc.offsets)[:n], labels
            )
            answers.append(
                [(e.label, e.start, e.end) for e in group_entities(tags, scores, spans, simple=True)]
            )
        return answers
    if task == "question-answering":
        return [_qa_answer(model, text) for text in texts]
    if task == "text-generation":
        from .checks import _causal_greedy

        assert model.tokenizer is not None
        return [_causal_greedy(model, model.tokenizer.encode(t).ids, NEW_TOKENS) for t in texts]
    if task == "translation":
        assert model.tokenizer is not None
        seq2seq = Seq2SeqModel(
            model.graphs["encoder"], model.graphs["decoder"], model.manifest, model.inplace.get("decoder")
        )
        sources = [
            prepare_source(model.manifest, e.ids, seq2seq.max_new_tokens, NEW_TOKENS)[0]
            for e in model.tokenizer.encode_batch(texts)
        ]
        return [h.tokens for h in seq2seq.greedy(sources, NEW_TOKENS)]
    from .checks import sample_images

    pre = required(model.manifest.preprocessing)
    images = sample_images(checkpoint.image_size, count=32)
    pixels = to_pixel_values(np.stack([image_pixels(open_image(b, 1 << 24), pre) for b in images]), pre)
    graph = model.graphs["model"]
    return [int(r.argmax()) for r in graph.run({graph.input_names[0]: pixels})[0]]


def _qa_answer(model: LoadedModel, text: str) -> tuple[int, int] | None:
    assert model.tokenizer is not None
    question, _, context = text.partition("\n")
    qa = required(model.manifest.qa)
    windows = qa_windows(
        model.tokenizer,
        question,
        context or question,
        required(model.manifest.max_sequence_length),
        qa.stride,
        qa.max_question_length,
    )
    feeds = pad_batch(
        [w.input_ids for w in windows], model.manifest.token("pad"), [w.token_type_ids for w in windows]
    )
    graph = model.graphs["model"]
    starts, ends = graph.run({k: feeds[k] for k in graph.input_names})
    span = best_span(
        windows, list(starts), list(ends), qa.max_answer_length, qa.span_score == "context_probabilities"
    )
    return (span.start, span.end) if span else None


def _agreement(reference: list[Any], answers: list[Any], task: str) -> float:
    if task == "feature-extraction":  # retrieval's answer: each text's nearest other text, by cosine
        nearest = []
        for vectors in (reference, answers):
            matrix = np.stack(vectors)
            similarity = matrix @ matrix.T
            np.fill_diagonal(similarity, -np.inf)
            nearest.append(similarity.argmax(1))
        same = list(nearest[0] == nearest[1])
    else:
        same = [a == b for a, b in zip(reference, answers, strict=True)]
    return float(np.mean(same))


def _on_data(model: LoadedModel, checkpoint: Checkpoint, examples: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's own metric on the user's examples, with the house's scoring code."""
    task = checkpoint.task
    run = model.graphs[next(iter(model.graphs))].run
    if task in ("text-classification", "feature-extraction", "image-classification"):
        labels = required(model.manifest.labels) if task != "feature-extraction" else None
        names = sorted({str(e["label"]) for e in examples})

        def index(label: Any) -> int:
            if labels is None:
                return names.index(str(label))
            if isinstance(label, int):
                return label
            if str(label) not in labels:
                raise ImportRefused(f"--data label {label!r} is not one of the checkpoint's {labels}")
            return labels.index(str(label))

        rows = [(e.get("text", ""), index(e["label"])) for e in examples]
        if task == "text-classification":
            return {"accuracy": evaluate.classifier_accuracy(run, *evaluate._encoder(model), rows)}
        if task == "feature-extraction":
            emb = evaluate.embed(model, [t for t, _ in rows])
            y = np.array([label for _, label in rows])
            centroids = np.stack([emb[y == k].mean(0) for k in range(len(names))])
            centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
            return {"centroid_accuracy": float(((emb @ centroids.T).argmax(1) == y).mean())}
        pre = required(model.manifest.preprocessing)
        images = [Path(e["image"]).read_bytes() for e in examples]
        pixels = to_pixel_values(np.stack([image_pixels(open_image(b, 1 << 26), pre) for b in images]), pre)
        logits = run({model.graphs["model"].input_names[0]: pixels})[0]
        return {"accuracy": float((logits.argmax(-1) == np.array([label for _, label in rows])).mean())}
    if task == "rerank":
        queries = [
            ranking.RankingQuery(
                e["query"], tuple(e["documents"]), int(e["relevant"]), tuple(range(len(e["documents"])))
            )
            for e in examples
        ]
        most = max(len(q.passages) for q in queries)  # every document of each query re-ordered
        return ranking.reranker_measures(queries, _pair_scores(model), most)
    if task == "token-classification":
        sentences = [TaggedSentence(list(e["tokens"]), list(e["tags"])) for e in examples]
        return evaluate.tagger_scores(
            run, *evaluate._encoder(model), required(model.manifest.labels), sentences
        )
    if task == "question-answering":
        squad = [
            SquadExample(
                str(i),
                "",
                e["context"],
                e["question"],
                [(a["answer_start"], a["text"]) for a in e["answers"]],
            )
            for i, e in enumerate(examples)
        ]
        qa = required(model.manifest.qa)
        spans = evaluate.QaSpans(qa.stride, qa.max_question_length, qa.max_answer_length)
        return evaluate.qa_scores(run, *evaluate._encoder(model), spans, squad)
    if task == "text-generation":
        assert model.tokenizer is not None
        text = "\n".join(e["text"] for e in examples)

        def window_logits(chunk: np.ndarray) -> np.ndarray:
            from service.engine.kv_cache import CacheLayout

            layout = CacheLayout.of(required(model.manifest.kv_cache))
            feeds = {
                "input_ids": chunk[None, :],
                "attention_mask": np.ones((1, len(chunk)), dtype=np.int64),
                "position_ids": np.arange(len(chunk), dtype=np.int64)[None, :],
                **dict(zip(layout.past_names, layout.empty(1), strict=True)),
            }
            return model.graphs["model"].run(feeds, ["logits"])[0][0]

        return evaluate.text_bits_per_char(
            window_logits, model.tokenizer, text, required(model.manifest.max_sequence_length)
        )
    assert model.tokenizer is not None
    seq2seq = Seq2SeqModel(
        model.graphs["encoder"], model.graphs["decoder"], model.manifest, model.inplace.get("decoder")
    )
    hypotheses = []
    for e in examples:
        source, limit, _ = prepare_source(
            model.manifest, model.tokenizer.encode(e["source"]).ids, seq2seq.max_new_tokens
        )
        best = seq2seq.beam_search([source], 4, limit)[0][0]
        hypotheses.append(model.tokenizer.decode(best.tokens, skip_special_tokens=True))
    targets = [e["target"] for e in examples]
    return {
        "bleu": scoring.corpus_bleu(hypotheses, targets),
        "chrf": scoring.corpus_chrf(hypotheses, targets),
    }


def scorer(folder: Path, checkpoint: Checkpoint, examples: list[dict[str, Any]] | None) -> Scorer:
    """The variants stage's measure for this import (see the module's docstring)."""
    inputs = _inputs(checkpoint) if examples is None else []
    cached: dict[str, list[Any]] = {}

    def evaluate_variant(variant: VariantChoice, device: Literal["cpu", "cuda"]) -> dict[str, Any]:
        model = load_model(folder, RuntimeOptions(device=device, variant=variant))
        if examples is not None:
            figures = _on_data(model, checkpoint, examples)
            return {**figures, "examples": len(examples), "version": model.version, "split": "--data"}
        answers = _answers(model, checkpoint, inputs)
        if variant == "reference":
            cached["reference"] = answers
        reference = cached.get("reference") or _answers(
            load_model(folder, RuntimeOptions(device="cpu", variant="reference")), checkpoint, inputs
        )
        cached["reference"] = reference
        return {
            "agreement": _agreement(reference, answers, checkpoint.task),
            "examples": len(inputs),
            "version": model.version,
            "split": "agreement with the reference graphs",
        }

    evaluate_fn: Callable[[VariantChoice, Literal["cpu", "cuda"]], dict[str, Any]] = evaluate_variant
    return Scorer(evaluate_fn, checkpoint.task if examples is not None else "agreement")


def build_import_variants(
    repository: Path, name: str, checkpoint: Checkpoint, model: Any, examples: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """The variants of an imported folder; None (its checked reference kept) where the stage failed."""
    folder = repository / name
    exported = (folder / "manifest.json").read_text()
    try:
        return build_variants(
            repository, name, Path("."), "--data", scorer=scorer(folder, checkpoint, examples)
        )
    except Exception:  # an optimization, not the model: keep the imported, checked folder
        log.exception("%s: the variants stage failed; it serves its reference graphs", name)
        (folder / "manifest.json").write_text(exported)
        for variant in ("fused", "int8", "fp16"):
            for file in folder.glob(f"*.{variant}*.onnx"):
                file.unlink()
        return None
