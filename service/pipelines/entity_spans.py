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


def group_entities(tags: list[str], scores: list[float], word_spans: list[tuple[int, int]]) -> list[Entity]:
    """BIO tags -> entities; an I-X that does not continue an X entity starts one (conlleval's reading)."""
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
        prefix, _, label = tag.partition("-")
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
