"""Extraction pipelines: extractive QA over sliding windows, and named entities from token tags.

QA: each (question, context) becomes all its windows ([CLS] question [SEP]
chunk [SEP], ``stride`` tokens of overlap, from the manifest); one queue entry
holds all windows of one pair, and ``run_batch`` runs every window of every
pair in the batch together (cut into model calls that fit the token budget),
then picks each pair's best span over its own windows.

Entities: a text longer than the model's window is cut to it; words beyond
are not tagged and the result says ``truncated``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.manifest import required
from service.engine.repository import LoadedModel
from service.errors import InvalidInputError

from .attention import AttentionQuery
from .base import TextEncoderPipeline
from .entity_spans import group_entities, word_char_spans, word_predictions
from .qa_spans import QAWindow, Span, best_span, qa_windows
from .results import Answer, Entities, EntitySpan, Outcome, Usage
from .text_inputs import encode_texts, preprocess


class QuestionAnswerer(TextEncoderPipeline[list[QAWindow], Span | None]):
    task = "question-answering"

    def __init__(
        self, model: LoadedModel, policy: BatchPolicy, observer: BatcherObserver | None = None
    ) -> None:
        super().__init__(model, policy, observer)
        qa = required(model.manifest.qa)
        self.stride = qa.stride
        self.max_question_length = qa.max_question_length
        self.max_answer_length = qa.max_answer_length
        # Windows per model call: a long context's windows never exceed the batch token budget at once.
        self.rows_per_call = max(1, policy.max_batch_tokens // self.max_len)

    def run_batch(self, items: list[list[QAWindow]]) -> Sequence[Span | None]:
        windows = [w for item in items for w in item]
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        for i in range(0, len(windows), self.rows_per_call):
            chunk = windows[i : i + self.rows_per_call]
            outputs = self.run_padded([w.input_ids for w in chunk], [w.token_type_ids for w in chunk])
            start_logits, end_logits = outputs[:2]
            starts.extend(start_logits)
            ends.extend(end_logits)
        spans: list[Span | None] = []
        first = 0
        for item in items:
            last = first + len(item)
            spans.append(best_span(item, starts[first:last], ends[first:last], self.max_answer_length))
            first = last
        return spans

    def windows(self, pairs: Sequence[tuple[str, str]]) -> list[list[QAWindow]]:
        return [
            qa_windows(self.tokenizer, q, c, self.max_len, self.stride, self.max_question_length)
            for q, c in pairs
        ]

    async def answer(
        self, pairs: Sequence[tuple[str, str]], attention: AttentionQuery | None = None
    ) -> Outcome[Answer]:
        """``pairs`` are (question, context); offsets in the answers index into each context.

        With ``attention`` (one pair that fits one window): the first result also carries the window's
        token x token self-attention ([CLS] question [SEP] context [SEP]).
        """
        selection = self.attention_maps.select(attention) if attention is not None else None
        self.batcher.admit(len(pairs))  # a full queue refuses before tokenisation is paid for
        windows = await preprocess(sum(len(q) + len(c) for q, c in pairs), self.windows, pairs)
        if attention is not None:
            if len(windows[0]) != 1:
                raise InvalidInputError(
                    f"the context takes {len(windows[0])} windows; return_attention needs it to fit one",
                    "context",
                    "too_long",
                )
            self.attention_maps.check_length(len(windows[0][0].input_ids), attention, "context")
        costs = [len(w) * max(map(len, w)) for w in windows]
        spans = await self.infer(windows, costs)
        results = []
        for (_, context), span, item in zip(pairs, spans, windows, strict=True):
            if span is None:
                results.append(Answer("", 0, 0, 0.0, None, len(item)))
            else:
                results.append(
                    Answer(
                        context[span.start : span.end],
                        span.start,
                        span.end,
                        span.score,
                        span.window,
                        len(item),
                    )
                )
        if selection is not None:
            window = windows[0][0]
            attention_map = await self.in_compute_thread(
                self.token_attention, window.input_ids, selection, window.token_type_ids
            )
            results[0] = dataclasses.replace(results[0], attention=attention_map)
        usage = Usage(input_tokens=sum(len(w) for item in windows for w in item))
        return Outcome(self.name, self.model.version, results, usage)

    async def warmup(self) -> None:
        await self.answer([("What is warmed up?", "The model is warmed up.")])


@dataclass(frozen=True)
class TaggedText:
    ids: list[int]
    word_ids: list[int | None]
    offsets: list[tuple[int, int]]
    truncated: bool


class EntityTagger(TextEncoderPipeline[list[int], np.ndarray]):
    task = "token-classification"

    def __init__(
        self, model: LoadedModel, policy: BatchPolicy, observer: BatcherObserver | None = None
    ) -> None:
        super().__init__(model, policy, observer)
        self.labels = required(model.manifest.labels)

    def run_batch(self, items: list[list[int]]) -> Sequence[np.ndarray]:
        logits = self.run_padded(items)[0]
        return [logits[j, : len(ids)] for j, ids in enumerate(items)]

    def encode(self, texts: Sequence[str]) -> list[TaggedText]:
        tagged = []
        for e in encode_texts(self.tokenizer, texts):
            ids, word_ids, offsets = list(e.ids), list(e.word_ids), list(e.offsets)
            truncated = len(ids) > self.max_len
            if truncated:  # keep the final [SEP], as in training
                keep = self.max_len - 1
                ids, word_ids, offsets = (
                    [*ids[:keep], ids[-1]],
                    [*word_ids[:keep], None],
                    [*offsets[:keep], (0, 0)],
                )
            tagged.append(TaggedText(ids, word_ids, offsets, truncated))
        return tagged

    def entities(self, text: str, tagged: TaggedText, logits: np.ndarray) -> Entities:
        tags, scores = word_predictions(logits, tagged.word_ids, self.labels)
        spans = word_char_spans(tagged.word_ids, tagged.offsets)
        found = [
            EntitySpan(text[e.start : e.end], e.label, e.start, e.end, e.score)
            for e in group_entities(tags, scores, spans)
        ]
        return Entities(found, tagged.truncated)

    async def tag(self, texts: Sequence[str], attention: AttentionQuery | None = None) -> Outcome[Entities]:
        """With ``attention`` (one text): the first result also carries its token x token self-attention."""
        selection = self.attention_maps.select(attention) if attention is not None else None
        self.batcher.admit(len(texts))  # a full queue refuses before tokenisation is paid for
        tagged = await preprocess(sum(map(len, texts)), self.encode, texts)
        if attention is not None:
            self.attention_maps.check_length(len(tagged[0].ids), attention, "text")
        logits = await self.infer([t.ids for t in tagged], [len(t.ids) for t in tagged])
        results = [self.entities(x, t, lg) for x, t, lg in zip(texts, tagged, logits, strict=True)]
        if selection is not None:
            attention_map = await self.in_compute_thread(self.token_attention, tagged[0].ids, selection)
            results[0] = dataclasses.replace(results[0], attention=attention_map)
        return Outcome(self.name, self.model.version, results, Usage(sum(len(t.ids) for t in tagged)))

    async def warmup(self) -> None:
        await self.tag(["Ada Lovelace lived in London."])
