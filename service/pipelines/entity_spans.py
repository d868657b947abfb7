"""Token tagging -> entities: per-word BIO tags from the first sub-token, then spans with character offsets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.engine.sampling import softmax


@dataclass
class Entity:
    label: str
    start: int  # character offsets into the input text
    end: int
    score: float
    first_word: int
    last_word: int


def word_predictions(
    logits: np.ndarray, word_ids: list[int | None], labels: list[str]
) -> tuple[list[str], list[float]]:
    """Each word takes the tag (and softmax probability) of its first sub-token, as in training."""
    probs = softmax(logits)  # float64
    tags: dict[int, tuple[str, float]] = {}
    for token, word in enumerate(word_ids):
        if word is not None and word not in tags:
            k = int(probs[token].argmax())
            tags[word] = (labels[k], float(probs[token, k]))
    n_words = max(tags) + 1 if tags else 0
    return [tags.get(w, ("O", 1.0))[0] for w in range(n_words)], [
        tags.get(w, ("O", 1.0))[1] for w in range(n_words)
    ]


def token_predictions(
    logits: np.ndarray, word_ids: list[int | None], offsets: list[tuple[int, int]], labels: list[str]
) -> tuple[list[str], list[float], list[tuple[int, int]]]:
    """Every real token's tag, softmax probability and character span (transformers' aggregation "simple":
    no word-level vote; special tokens, which belong to no word, are left out)."""
    probs = softmax(logits)  # float64
    tags: list[str] = []
    scores: list[float] = []
    spans: list[tuple[int, int]] = []
    for token, word in enumerate(word_ids):
        if word is None:
            continue
        k = int(probs[token].argmax())
        tags.append(labels[k])
        scores.append(float(probs[token, k]))
        spans.append(offsets[token])
    return tags, scores, spans


def _split_tag(tag: str, simple: bool) -> tuple[str, str]:
    """(prefix, entity type); with ``simple``, transformers' reading: a tag without B-/I- is "I" of itself."""
    if simple and not tag.startswith(("B-", "I-")):
        return "I", tag
    prefix, _, label = tag.partition("-")
    return prefix, label


def group_entities(
    tags: list[str], scores: list[float], word_spans: list[tuple[int, int]], simple: bool = False
) -> list[Entity]:
    """BIO tags -> entities; an I-X that does not continue an X entity starts one (conlleval's reading).

    ``simple``: the tags are tokens' (``token_predictions``), and a tag without a B-/I- prefix continues
    a run of itself, as transformers' aggregation "simple" groups."""
    entities: list[Entity] = []
    current: Entity | None = None
    member_scores: list[float] = []

    def close() -> None:
        nonlocal current
        if current is not None:
            current.score = float(np.mean(member_scores))
            entities.append(current)
        current = None

    for w, tag in enumerate(tags):
        prefix, label = _split_tag(tag, simple)
        continues = current is not None and prefix == "I" and label == current.label
        if tag == "O" or not continues:
            close()
        if tag == "O":
            continue
        if continues and current is not None:
            current.end, current.last_word = word_spans[w][1], w
            member_scores.append(scores[w])
        else:
            current = Entity(label, word_spans[w][0], word_spans[w][1], 0.0, w, w)
            member_scores = [scores[w]]
    close()
    return entities


def word_char_spans(word_ids: list[int | None], offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) of each word in the original text, from its sub-tokens' offsets."""
    spans: dict[int, tuple[int, int]] = {}
    for word, (start, end) in zip(word_ids, offsets, strict=True):
        if word is None:
            continue
        s, e = spans.get(word, (start, end))
        spans[word] = (min(s, start), max(e, end))
    return [spans[w] for w in range(max(spans) + 1)] if spans else []
