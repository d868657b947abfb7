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
    """(start, end) of each word in the original text, from its sub-tokens' offsets ((0, 0) for a word none of
    whose tokens was kept)."""
    spans: dict[int, tuple[int, int]] = {}
    for word, (start, end) in zip(word_ids, offsets, strict=True):
        if word is None:
            continue
        s, e = spans.get(word, (start, end))
        spans[word] = (min(s, start), max(e, end))
    # a word cut away (truncation_direction left drops the text's first words) has no span; its tag is "O"
    return [spans.get(w, (0, 0)) for w in range(max(spans) + 1)] if spans else []


STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass(frozen=True)
class Aggregation:
    """How a request asks tokens' tags to become entities, as transformers' ``TokenClassificationPipeline``
    defines ``aggregation_strategy``: ``none`` (every token, its full tag), ``simple`` (runs of tokens), or
    word-level ``first`` / ``average`` / ``max`` (a word's tag from its first sub-token, the mean of its
    sub-tokens' probabilities, or its most confident sub-token), then runs of words; groups (or tokens) whose
    label is in ``ignore_labels`` are left out."""

    strategy: str
    ignore_labels: tuple[str, ...] = ("O",)

    @property
    def key(self) -> dict[str, object]:
        return {"aggregation_strategy": self.strategy, "ignore_labels": list(self.ignore_labels)}


def _get_tag(name: str) -> tuple[str, str]:
    """transformers' reading of a tag: B-X / I-X, and a tag without a prefix is I of itself (``O`` too)."""
    if name.startswith("B-"):
        return "B", name[2:]
    if name.startswith("I-"):
        return "I", name[2:]
    return "I", name


def aggregate(
    logits: np.ndarray,
    word_ids: list[int | None],
    offsets: list[tuple[int, int]],
    labels: list[str],
    aggregation: Aggregation,
) -> list[Entity]:
    """The entities of one text under ``aggregation`` (special tokens, which belong to no word, left out)."""
    probs = softmax(logits)  # float64
    tokens = [t for t, w in enumerate(word_ids) if w is not None]
    items: list[tuple[str, float, int, int]] = []  # (tag, score, start, end) per token or word
    if aggregation.strategy in ("none", "simple"):
        for t in tokens:
            k = int(probs[t].argmax())
            items.append((labels[k], float(probs[t, k]), *offsets[t]))
    else:
        words: list[list[int]] = []
        for t in tokens:
            if words and word_ids[words[-1][-1]] == word_ids[t]:
                words[-1].append(t)
            else:
                words.append([t])
        for members in words:
            if aggregation.strategy == "first":
                p = probs[members[0]]
            elif aggregation.strategy == "max":
                p = probs[max(members, key=lambda t: float(probs[t].max()))]
            else:  # average
                p = probs[members].mean(axis=0)
            k = int(p.argmax())
            items.append((labels[k], float(p[k]), offsets[members[0]][0], offsets[members[-1]][1]))
    ignored = set(aggregation.ignore_labels)
    if aggregation.strategy == "none":
        return [
            Entity(tag, s, e, score, i, i) for i, (tag, score, s, e) in enumerate(items) if tag not in ignored
        ]
    groups: list[
        tuple[str, list[int]]
    ] = []  # transformers' group_entities: a run continues unless B- or a new type
    for i, (tag, _, _, _) in enumerate(items):
        bi, kind = _get_tag(tag)
        if groups and groups[-1][0] == kind and bi != "B":
            groups[-1][1].append(i)
        else:
            groups.append((kind, [i]))
    return [
        Entity(
            kind,
            items[members[0]][2],
            items[members[-1]][3],
            float(np.mean([items[i][1] for i in members])),
            members[0],
            members[-1],
        )
        for kind, members in groups
        if kind not in ignored
    ]
