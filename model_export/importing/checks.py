"""The served files against the checkpoint's own PyTorch model in ``transformers``, on generated inputs.

Each check loads the exported folder as the service does (``service.engine.repository.load_model``,
the reference graphs) and runs the service's own pre- and post-processing; the reference is the
checkpoint loaded afresh by ``transformers`` (its default attention), with its own tokenizer,
pipelines and ``generate()``:

- logits (every head; GPT-2 and Marian on a prompt's every position): max |ONNX - torch| <= 1e-4;
- text classification: the top label and its probability, as the ``text-classification`` pipeline;
- token classification: the entities of the ``token-classification`` pipeline (aggregation "simple"),
  type, start, end and score;
- question answering: the answer span of transformers' own span selection (``select_starts_ends``, the
  question-answering pipeline's, which transformers 5 keeps only in its document-QA module) over the
  windows its tokenizer makes with the same stride, best probability over every window;
- embeddings: cosine >= 0.9999 against sentence-transformers' encode (or mean pooling of ``AutoModel``);
- rerank: (query, document) pairs, some cut to the window: the service's pair encoding equal to the
  ``transformers`` tokenizer's (``truncation=True``, longest first), the served logit against
  ``AutoModelForSequenceClassification``'s on the tokenizer's encoding, and the served score (the
  logit's sigmoid) against sentence-transformers' ``CrossEncoder.predict``;
- GPT-2: ``generate()`` greedy tokens equal to decoding with the KV cache through the graph;
- Marian: ``generate(num_beams=1)`` and ``generate(num_beams=4)`` tokens equal to the service's own greedy
  and beam search (``service.engine.seq2seq``);
- ViT: the image processor's pixels and the ``image-classification`` pipeline's top label.

``run_checks`` returns the figures (the manifest's ``checks``) and raises ``ImportRefused`` when one is
missed: a folder that does not answer as its checkpoint does is never served.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.engine.kv_cache import CacheLayout
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import softmax
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.entity_spans import group_entities, token_predictions
from service.pipelines.image_inputs import image_pixels, open_image, to_pixel_values
from service.pipelines.qa_spans import best_span, qa_windows
from service.pipelines.rerank import SCORES
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate
from service.pipelines.translate import prepare_source

from ..ranking import encode_pair
from .checkpoint import Checkpoint, ImportRefused
from .tokenizer import SAMPLE_TEXTS

log = logging.getLogger(__name__)

LOGITS_TOLERANCE = 1e-4
COSINE_MINIMUM = 0.9999
SCORE_TOLERANCE = 1e-4  # a probability the service reports against the pipeline's
NEW_TOKENS = 12  # generated per prompt / source in the decoding checks
QUESTIONS = ["Who watches the dogs?", "When does the café open?", "What is in brackets?"]


def reference_model(checkpoint: Checkpoint) -> Any:
    """The checkpoint's own model as ``transformers`` loads it for its task (default attention)."""
    import transformers

    classes = {
        "text-classification": transformers.AutoModelForSequenceClassification,
        "token-classification": transformers.AutoModelForTokenClassification,
        "question-answering": transformers.AutoModelForQuestionAnswering,
        "feature-extraction": transformers.AutoModel,
        "rerank": transformers.AutoModelForSequenceClassification,
        "text-generation": transformers.AutoModelForCausalLM,
        "translation": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }
    return classes[checkpoint.task].from_pretrained(str(checkpoint.folder), dtype="float32").eval()


def _hf_tokenizer(checkpoint: Checkpoint) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint.folder))


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0


def _encoded(model: LoadedModel, texts: list[str]) -> list[list[int]]:
    assert model.tokenizer is not None
    window = required(model.manifest.max_sequence_length)
    return [truncate(e.ids, window) for e in model.tokenizer.encode_batch(texts)]


def _encoder_logits(
    model: LoadedModel, reference: Any, texts: list[str]
) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """The head's outputs per output name, ONNX and torch, on one padded batch; their largest difference."""
    rows = _encoded(model, texts)
    feeds = pad_batch(rows, model.manifest.token("pad"))
    graph = model.graphs["model"]
    got = graph.run({k: feeds[k] for k in graph.input_names})
    with torch.no_grad():
        kwargs = {k: torch.from_numpy(feeds[k]) for k in graph.input_names}
        out = reference(**kwargs)
    names = [o.name for o in model.manifest.graphs["model"].outputs]
    expected = [getattr(out, name).numpy() for name in names]
    mask = feeds["attention_mask"].astype(bool)
    worst = 0.0
    for g, e in zip(got, expected, strict=True):
        if g.ndim >= 2 and g.shape[:2] == mask.shape:  # per token: padding positions are not answers
            worst = max(worst, _max_diff(g[mask], e[mask]))
        else:
            worst = max(worst, _max_diff(g, e))
    return got, expected, worst


def _classification(
    checkpoint: Checkpoint, model: LoadedModel, reference: Any, texts: list[str]
) -> dict[str, Any]:
    from transformers import pipeline

    got, _, worst = _encoder_logits(model, reference, texts)
    labels = required(model.manifest.labels)
    classify = pipeline("text-classification", model=reference, tokenizer=_hf_tokenizer(checkpoint))
    answers = classify(texts, truncation=True)
    probs = softmax(got[0])
    equal = sum(
        labels[int(p.argmax())] == a["label"] and abs(float(p.max()) - a["score"]) <= SCORE_TOLERANCE
        for p, a in zip(probs, answers, strict=True)
    )
    return {
        "logits_max_abs_diff": worst,
        "labels_equal_to_pipeline": f"{equal}/{len(texts)}",
        "passed": worst <= LOGITS_TOLERANCE and equal == len(texts),
    }


def _entities(checkpoint: Checkpoint, model: LoadedModel, reference: Any, texts: list[str]) -> dict[str, Any]:
    from transformers import pipeline

    got, _, worst = _encoder_logits(model, reference, texts)
    labels = required(model.manifest.labels)
    assert model.tokenizer is not None
    tag = pipeline(
        "token-classification",
        model=reference,
        tokenizer=_hf_tokenizer(checkpoint),
        aggregation_strategy="simple",
    )
    equal, found = 0, 0
    for row, (text, encoding) in enumerate(zip(texts, model.tokenizer.encode_batch(texts), strict=True)):
        n = len(encoding.ids)
        tags, scores, spans = token_predictions(
            got[0][row, :n], list(encoding.word_ids), list(encoding.offsets), labels
        )
        served = [
            (e.label, e.start, e.end, e.score) for e in group_entities(tags, scores, spans, simple=True)
        ]
        expected = [(e["entity_group"], e["start"], e["end"], float(e["score"])) for e in tag(text)]
        found += len(expected)
        equal += len(served) == len(expected) and all(
            s[:3] == e[:3] and abs(s[3] - e[3]) <= SCORE_TOLERANCE
            for s, e in zip(served, expected, strict=True)
        )
    return {
        "logits_max_abs_diff": worst,
        "entities_equal_to_pipeline": f"{equal}/{len(texts)}",
        "entities_compared": found,
        "aggregation": "simple",
        "passed": worst <= LOGITS_TOLERANCE and equal == len(texts),
    }


def _qa_reference(
    hf: Any,
    reference: Any,
    question: str,
    context: str,
    window: int,
    stride: int,
    max_answer: int,
    segments: bool = True,
) -> tuple[int, int, float]:
    """transformers' answer: its tokenizer's windows (only_second, stride), ``select_starts_ends`` per
    window, the most probable span over them all; (start, end, score) in the context's characters."""
    from transformers.pipelines.document_question_answering import select_starts_ends

    enc = hf(
        question,
        context,
        truncation="only_second",
        max_length=window,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=True,
        return_tensors="pt",
        return_token_type_ids=segments,
    )
    with torch.no_grad():
        kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
        out = reference(**kwargs)
    best = (0, 0, -1.0)
    for w in range(enc["input_ids"].shape[0]):
        sequence = enc.sequence_ids(w)
        p_mask = np.array([s != 1 for s in sequence], dtype=np.int64)
        p_mask[0] = 0  # [CLS] takes part in the softmax (the pipeline's p_mask), then gets no span
        starts, ends, scores, _ = select_starts_ends(
            out.start_logits[w : w + 1].numpy(),
            out.end_logits[w : w + 1].numpy(),
            p_mask,
            enc["attention_mask"][w].numpy(),
            max_answer_len=max_answer,
        )
        if len(scores) and float(scores[0]) > best[2]:
            offsets = enc["offset_mapping"][w].tolist()
            best = (offsets[int(starts[0])][0], offsets[int(ends[0])][1], float(scores[0]))
    return best


def _qa(checkpoint: Checkpoint, model: LoadedModel, reference: Any) -> dict[str, Any]:
    assert model.tokenizer is not None
    qa = required(model.manifest.qa)
    window = required(model.manifest.max_sequence_length)
    context = " ".join(SAMPLE_TEXTS * 2)  # long enough for several windows in a small model
    hf = _hf_tokenizer(checkpoint)
    pad = model.manifest.token("pad")
    graph = model.graphs["model"]
    worst, equal, windows = 0.0, 0, 0
    for question in QUESTIONS:
        served = qa_windows(model.tokenizer, question, context, window, qa.stride, qa.max_question_length)
        windows += len(served)
        feeds = pad_batch([w.input_ids for w in served], pad, [w.token_type_ids for w in served])
        start_logits, end_logits = graph.run({k: feeds[k] for k in graph.input_names})
        with torch.no_grad():
            out = reference(**{k: torch.from_numpy(feeds[k]) for k in graph.input_names})
        mask = feeds["attention_mask"].astype(bool)
        worst = max(worst, _max_diff(start_logits[mask], out.start_logits.numpy()[mask]))
        worst = max(worst, _max_diff(end_logits[mask], out.end_logits.numpy()[mask]))
        span = best_span(served, list(start_logits), list(end_logits), qa.max_answer_length, True)
        expected = _qa_reference(
            hf, reference, question, context, window, qa.stride, qa.max_answer_length, checkpoint.segments
        )
        equal += (
            span is not None
            and (span.start, span.end) == expected[:2]
            and abs(span.score - expected[2]) <= SCORE_TOLERANCE
        )
    return {
        "logits_max_abs_diff": worst,
        "spans_equal_to_transformers": f"{equal}/{len(QUESTIONS)}",
        "windows": windows,
        "passed": worst <= LOGITS_TOLERANCE and equal == len(QUESTIONS),
    }


def _embeddings(
    checkpoint: Checkpoint, model: LoadedModel, reference: Any, texts: list[str]
) -> dict[str, Any]:
    rows = _encoded(model, texts)
    feeds = pad_batch(rows, model.manifest.token("pad"))
    graph = model.graphs["model"]
    spec = required(model.manifest.embedding)
    normalized, pooled = graph.run(
        {k: feeds[k] for k in graph.input_names}, [spec.normalized_output, spec.pooled_output]
    )
    if checkpoint.sentence_transformers:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(checkpoint.folder), device="cpu")
        st.max_seq_length = required(model.manifest.max_sequence_length)
        expected = st.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
        against = "sentence-transformers SentenceTransformer.encode(normalize_embeddings=True)"
    else:
        with torch.no_grad():
            states = reference(**{k: torch.from_numpy(feeds[k]) for k in graph.input_names}).last_hidden_state
        weights = torch.from_numpy(feeds["attention_mask"]).unsqueeze(-1).float()
        mean = (states * weights).sum(1) / weights.sum(1)
        expected = torch.nn.functional.normalize(mean, dim=-1).numpy()
        against = "mean pooling of transformers' AutoModel"
    cosine = (normalized * expected).sum(-1) / (
        np.linalg.norm(normalized, axis=-1) * np.linalg.norm(expected, axis=-1)
    )
    unit = np.abs(np.linalg.norm(pooled, axis=-1, keepdims=True) * normalized - pooled).max()
    return {
        "embedding_min_cosine": float(cosine.min()),
        "against": against,
        "texts": len(texts),
        "pooled_consistent": bool(unit < 1e-4),
        "passed": float(cosine.min()) >= COSINE_MINIMUM,
    }


def rerank_pairs() -> list[tuple[str, str]]:
    """The check's (query, document) pairs: each question against each sample text, and against a document
    long enough to be cut to a small model's window."""
    long = " ".join(SAMPLE_TEXTS * 3)
    return [(q, d) for q in QUESTIONS for d in [*SAMPLE_TEXTS, long, "ok"]]


def _rerank(checkpoint: Checkpoint, model: LoadedModel, reference: Any) -> dict[str, Any]:
    from sentence_transformers import CrossEncoder

    assert model.tokenizer is not None
    window = required(model.manifest.max_sequence_length)
    pairs = rerank_pairs()
    served = [encode_pair(model.tokenizer, q, d, window) for q, d in pairs]
    feeds = pad_batch([ids for ids, _ in served], model.manifest.token("pad"), [t for _, t in served])
    graph = model.graphs["model"]
    logits = np.asarray(graph.run(feeds_for(graph, feeds))[0]).reshape(len(pairs), -1)[:, 0]
    hf = _hf_tokenizer(checkpoint)
    encoded = hf(
        [q for q, _ in pairs],
        [d for _, d in pairs],
        padding=True,
        truncation=True,
        max_length=window,
        return_tensors="pt",
        return_token_type_ids=checkpoint.segments,
    )
    equal, cut = 0, 0
    for row, (ids, types) in enumerate(served):
        real = encoded["attention_mask"][row].bool()
        same = encoded["input_ids"][row][real].tolist() == ids
        if checkpoint.segments:
            same = same and encoded["token_type_ids"][row][real].tolist() == types
        equal += same
        cut += len(ids) < len(model.tokenizer.encode(*pairs[row]).ids)
    names = (
        ("input_ids", "attention_mask", "token_type_ids")
        if checkpoint.segments
        else ("input_ids", "attention_mask")
    )
    with torch.no_grad():
        expected = reference(**{k: encoded[k] for k in names}).logits.numpy()
    worst = _max_diff(logits, expected.reshape(len(pairs), -1)[:, 0])
    st = CrossEncoder(str(checkpoint.folder), device="cpu")
    st.max_seq_length = window
    predicted = np.asarray(
        st.predict(pairs, convert_to_numpy=True, show_progress_bar=False), dtype=np.float64
    )
    activation = SCORES[(model.manifest.model_extra or {})["ranking"]["score"]]  # as the service answers
    scores = np.array([activation(float(x)) for x in logits])
    score_diff = _max_diff(scores, predicted.reshape(-1))
    return {
        "logits_max_abs_diff": worst,
        "pairs_equal_to_tokenizer": f"{equal}/{len(pairs)}",
        "pairs_truncated": cut,
        "score_max_abs_diff_to_cross_encoder": score_diff,
        "against": "transformers' AutoModelForSequenceClassification logits; sentence-transformers "
        "CrossEncoder.predict (its declared activation of the logit)",
        "passed": worst <= LOGITS_TOLERANCE and equal == len(pairs) and score_diff <= SCORE_TOLERANCE,
    }


def _causal_greedy(model: LoadedModel, ids: list[int], new: int) -> list[int]:
    """Greedy tokens through the graph with its KV cache: the prompt at once, then one token a step."""
    graph = model.graphs["model"]
    layout = CacheLayout.of(required(model.manifest.kv_cache))
    past = layout.empty(1)
    tokens = list(ids)
    step = np.array([ids], dtype=np.int64)
    out: list[int] = []
    for _ in range(new):
        total = len(tokens)
        start = total - step.shape[1]
        feeds = {
            "input_ids": step,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": np.arange(start, total, dtype=np.int64)[None, :],
            **dict(zip(layout.past_names, past, strict=True)),
        }
        logits, *past = graph.run(feeds)
        token = int(logits[0, -1].argmax())
        out.append(token)
        tokens.append(token)
        if token == model.manifest.token("eos"):
            break
        step = np.array([[token]], dtype=np.int64)
    return out


def _generation(
    checkpoint: Checkpoint, model: LoadedModel, reference: Any, texts: list[str]
) -> dict[str, Any]:
    assert model.tokenizer is not None
    graph = model.graphs["model"]
    layout = CacheLayout.of(required(model.manifest.kv_cache))
    worst, equal = 0.0, 0
    eos = model.manifest.token("eos")
    for text in texts:
        ids = model.tokenizer.encode(text).ids
        feeds = {
            "input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None, :],
            **dict(zip(layout.past_names, layout.empty(1), strict=True)),
        }
        logits = graph.run(feeds, ["logits"])[0]
        with torch.no_grad():
            expected = reference(input_ids=torch.tensor([ids])).logits.numpy()
            generated = reference.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                num_beams=1,
                pad_token_id=model.manifest.token("pad"),
            )[0, len(ids) :].tolist()
        worst = max(worst, _max_diff(logits, expected))
        served = _causal_greedy(model, ids, NEW_TOKENS)
        equal += served == generated[: len(served)] and (len(served) == len(generated) or served[-1] == eos)
    return {
        "logits_max_abs_diff": worst,
        "greedy_tokens_equal_to_generate": f"{equal}/{len(texts)}",
        "new_tokens": NEW_TOKENS,
        "kv_cache": True,
        "passed": worst <= LOGITS_TOLERANCE and equal == len(texts),
    }


def _hf_generate(reference: Any, source: list[int], beams: int, new: int) -> list[int]:
    with torch.no_grad():
        out = reference.generate(
            input_ids=torch.tensor([source]),
            attention_mask=torch.ones((1, len(source)), dtype=torch.long),
            num_beams=beams,
            max_new_tokens=new,
            do_sample=False,
            length_penalty=1.0,
            early_stopping=False,
            num_return_sequences=1,
        )[0].tolist()
    return out[1:]  # without the decoder start token


def _translation(
    checkpoint: Checkpoint, model: LoadedModel, reference: Any, texts: list[str]
) -> dict[str, Any]:
    assert model.tokenizer is not None
    manifest = model.manifest
    seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], manifest)
    eos = manifest.token("eos")
    worst = 0.0
    equal = {1: 0, 4: 0}
    for text in texts:
        source, limit, _ = prepare_source(
            manifest, model.tokenizer.encode(text).ids, seq2seq.max_new_tokens, NEW_TOKENS
        )
        # logits of a teacher-forced prefix: every decoder position, through the cache graphs step by step
        prefix = [manifest.decoder_start, *_hf_generate(reference, source, 1, 6)]
        cross, src_mask = seq2seq.encode([source])
        past = seq2seq.layout.empty(1)
        for step, token in enumerate(prefix):
            feeds = {
                "input_ids": np.array([[token]], dtype=np.int64),
                "attention_mask": np.ones((1, step + 1), dtype=np.int64),
                "position_ids": np.array([[step]], dtype=np.int64),
                seq2seq.cross_mask_name: src_mask,
                **cross,
                **dict(zip(seq2seq.layout.past_names, past, strict=True)),
            }
            logits, *past = model.graphs["decoder"].run(feeds)
            with torch.no_grad():
                expected = (
                    reference(
                        input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix[: step + 1]])
                    )
                    .logits[0, -1]
                    .numpy()
                )
            worst = max(worst, _max_diff(logits[0, -1], expected))
        for beams in equal:
            expected_tokens = _hf_generate(reference, source, beams, limit)
            if beams == 1:
                (hypothesis,) = seq2seq.greedy([source], limit)
            else:
                hypothesis = seq2seq.beam_search([source], beams, limit)[0][0]
            served = [*hypothesis.tokens, eos] if hypothesis.finished else hypothesis.tokens
            equal[beams] += served == expected_tokens
    return {
        "logits_max_abs_diff": worst,
        "greedy_tokens_equal_to_generate": f"{equal[1]}/{len(texts)}",
        "beam4_tokens_equal_to_generate": f"{equal[4]}/{len(texts)}",
        "new_tokens": NEW_TOKENS,
        "passed": worst <= LOGITS_TOLERANCE and equal[1] == equal[4] == len(texts),
    }


def sample_images(size: int, count: int = 6, seed: int = 0) -> list[bytes]:
    """PNG images of several sizes and modes: what the check decodes as the service does."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        shape = (size + 7 * i, size + 3 * i, 3)
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(array, "RGB").save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images


def _images(checkpoint: Checkpoint, model: LoadedModel, reference: Any) -> dict[str, Any]:
    from PIL import Image
    from transformers import AutoImageProcessor, pipeline

    pre = required(model.manifest.preprocessing)
    processor = AutoImageProcessor.from_pretrained(str(checkpoint.folder))
    images = sample_images(checkpoint.image_size)
    served = to_pixel_values(np.stack([image_pixels(open_image(b, 1 << 24), pre) for b in images]), pre)
    expected = processor(images=[Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")[
        "pixel_values"
    ]
    pixel_diff = _max_diff(served, expected.numpy())
    graph = model.graphs["model"]
    logits = graph.run({graph.input_names[0]: served})[0]
    with torch.no_grad():
        reference_logits = reference(pixel_values=expected).logits.numpy()
    classify = pipeline("image-classification", model=reference, image_processor=processor)
    labels = required(model.manifest.labels)
    opened: list[Any] = [Image.open(io.BytesIO(b)) for b in images]
    answers = classify(opened, top_k=1)
    probs = softmax(logits)
    equal = sum(
        labels[int(p.argmax())] == a[0]["label"] and abs(float(p.max()) - a[0]["score"]) <= SCORE_TOLERANCE
        for p, a in zip(probs, answers, strict=True)
    )
    worst = _max_diff(logits, reference_logits)
    return {
        "logits_max_abs_diff": worst,
        "pixel_max_abs_diff": pixel_diff,
        "labels_equal_to_pipeline": f"{equal}/{len(images)}",
        "passed": worst <= LOGITS_TOLERANCE and pixel_diff <= 1e-5 and equal == len(images),
    }


def run_checks(checkpoint: Checkpoint, model: Any, folder: Path, seed: int = 0) -> dict[str, Any]:
    """Every figure of the task against ``transformers``; ImportRefused when one is missed."""
    served = load_model(folder, RuntimeOptions(device="cpu", variant="reference"))
    reference = reference_model(checkpoint)
    texts = list(SAMPLE_TEXTS)
    task = checkpoint.task
    if task == "text-classification":
        figures = _classification(checkpoint, served, reference, texts)
    elif task == "token-classification":
        figures = _entities(checkpoint, served, reference, texts)
    elif task == "question-answering":
        figures = _qa(checkpoint, served, reference)
    elif task == "feature-extraction":
        figures = _embeddings(checkpoint, served, reference, texts)
    elif task == "rerank":
        figures = _rerank(checkpoint, served, reference)
    elif task == "text-generation":
        figures = _generation(checkpoint, served, reference, texts)
    elif task == "translation":
        figures = _translation(checkpoint, served, reference, texts)
    else:
        figures = _images(checkpoint, served, reference)
    if tokenizer_equal := _tokenizer_check(checkpoint, served, texts):
        figures["tokenizer_ids_equal"] = tokenizer_equal
    figures = {"logits_tolerance": LOGITS_TOLERANCE, **figures}
    if not figures["passed"]:
        raise ImportRefused(
            f"{folder.name} does not answer as the checkpoint does in transformers: {figures}"
        )
    return figures


def _tokenizer_check(checkpoint: Checkpoint, model: LoadedModel, texts: list[str]) -> str | None:
    """The served tokenizer.json against the checkpoint's tokenizer in transformers, on the check texts."""
    if model.tokenizer is None:
        return None
    hf = _hf_tokenizer(checkpoint)
    equal = 0
    for text in texts:
        ids = model.tokenizer.encode(text).ids
        if checkpoint.family == "marian":
            ids = [*ids, model.manifest.token("eos")]
        equal += ids == list(hf(text).input_ids)
    if equal != len(texts):
        raise ImportRefused(
            f"the served tokenizer encodes {len(texts) - equal} of {len(texts)} texts unlike the checkpoint's"
        )
    return f"{equal}/{len(texts)}"


def summary(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
