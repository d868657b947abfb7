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

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.manifest import required
from service.engine.repository import LoadedModel
from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta

from .attention import AttentionFeeds
from .base import Building, TextEncoderPipeline, TextPipeline, Workers
from .contract import TRUNCATION_PARAMETERS, Parameter, TaskContract, TensorSpec, text_input
from .entity_spans import (
    Aggregation,
    aggregate,
    group_entities,
    token_predictions,
    word_char_spans,
    word_predictions,
)
from .qa_spans import QAWindow, Span, best_span, qa_windows
from .results import Answer, Entities, EntitySpan, Outcome, Usage
from .text_inputs import CUT_RIGHT, EncodedText, Truncation, encode_texts, preprocess


class QuestionAnswerer(TextEncoderPipeline[list[QAWindow], Span | None]):
    contract = TaskContract(
        "question-answering",
        "bert-qa",
        (text_input("question", "UTF-8 question"), text_input("context", "UTF-8 context")),
        (
            TensorSpec("answer", "BYTES", "the answer span's text", value=lambda a: a.answer),
            TensorSpec(
                "start", "INT64", "its start: a character offset into the context", value=lambda a: a.start
            ),
            TensorSpec("end", "INT64", "its end: answer == context[start:end]", value=lambda a: a.end),
            TensorSpec("score", "FP32", "p(start) * p(end)", value=lambda a: a.score),
        ),
    )

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> QuestionAnswerer:
        return cls(
            model,
            building.policy(),
            building.batcher_observer(model.name),
            max_context_tokens=building.settings.max_context_tokens,
            workers=building.workers,
        )

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        observer: BatcherObserver | None = None,
        max_context_tokens: int | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        self.max_context_tokens = max_context_tokens
        qa = required(model.manifest.qa)
        self.stride = qa.stride
        self.max_question_length = qa.max_question_length
        self.max_answer_length = qa.max_answer_length
        self.context_probabilities = qa.span_score == "context_probabilities"
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
            spans.append(
                best_span(
                    item,
                    starts[first:last],
                    ends[first:last],
                    self.max_answer_length,
                    self.context_probabilities,
                )
            )
            first = last
        return spans

    def windows(self, pairs: Sequence[tuple[str, str]]) -> list[list[QAWindow]]:
        return [
            qa_windows(self.tokenizer, q, c, self.max_len, self.stride, self.max_question_length)
            for q, c in pairs
        ]

    async def answer(
        self, pairs: Sequence[tuple[str, str]], meta: RequestMeta = ANONYMOUS
    ) -> Outcome[Answer]:
        """``pairs`` are (question, context); offsets in the answers index into each context."""
        with self.batcher.reserve(len(pairs), meta) as permit:  # a full queue refuses before tokenising
            windows = await preprocess(sum(len(q) + len(c) for q, c in pairs), self.windows, pairs)
            self._check_tokens(windows)
            costs = [len(w) * max(map(len, w)) for w in windows]
            spans = await self.infer(windows, costs, permit, meta)
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
        usage = Usage(input_tokens=sum(len(w) for item in windows for w in item))
        return Outcome(self.name, self.model.version, results, usage)

    def _check_tokens(self, windows: list[list[QAWindow]]) -> None:
        """The request's compute: the tokens of all its windows (MAX_CONTEXT_TOKENS), named by the pair that
        passes the limit. The first pair always passes: MAX_CONTEXT_CHARS bounds one pair, and a context
        within it is answerable alone whatever the model's windows (a model with short windows, the tiny
        one's 96 tokens, cuts SQuAD's longest context into more window tokens than the budget)."""
        if self.max_context_tokens is None:
            return
        total = 0
        for index, item in enumerate(windows):
            total += sum(len(w) for w in item)
            if total > self.max_context_tokens and index > 0:
                raise InvalidInputError(
                    f"the request's contexts take more than {self.max_context_tokens} tokens in windows "
                    f"(MAX_CONTEXT_TOKENS); with this one, {total}",
                    "contexts",
                    "too_long",
                    index,
                )

    def attention_length(self, pair: tuple[str, str]) -> tuple[int, str]:
        """A map covers one window: the pair must fit one ([CLS] question [SEP] context [SEP])."""
        (windows,) = self.windows([pair])
        if len(windows) != 1:
            raise InvalidInputError(
                f"the context takes {len(windows)} windows; return_attention needs it to fit one",
                "contexts",
                "too_long",
            )
        return len(windows[0].input_ids), "contexts"

    def attention_feeds(self, pair: tuple[str, str], result: Answer) -> AttentionFeeds:
        (windows,) = self.windows([pair])
        return self.token_feeds(windows[0].input_ids, windows[0].token_type_ids)

    async def warmup(self) -> None:
        await self.answer([("What is warmed up?", "The model is warmed up.")])


@dataclass(frozen=True)
class TaggedText(EncodedText):
    """One text's ids, with each token's word and character offsets (what the tags are read back by)."""

    word_ids: list[int | None]
    offsets: list[tuple[int, int]]


class EntityTagger(TextPipeline[np.ndarray]):
    contract = TaskContract(
        "token-classification",
        "bert-tagger",
        (text_input("text", "UTF-8 text"),),
        (
            TensorSpec(
                "entities",
                "BYTES",
                'JSON array per item: [{"text", "label", "start", "end", "score"}], character offsets',
                value=lambda r: json.dumps([asdict(e) for e in r.entities], ensure_ascii=False),
            ),
        ),
        (
            *TRUNCATION_PARAMETERS,
            Parameter(
                "aggregation_strategy", "string", "none, simple, first, average or max, as transformers'"
            ),
            Parameter("ignore_labels", "strings", 'labels left out (default ["O"])'),
        ),
    )

    @property
    def labels(self) -> list[str]:
        return required(self.model.manifest.labels)

    def run_batch(self, items: list[list[int]]) -> Sequence[np.ndarray]:
        logits = self.run_padded(items)[0]
        return [logits[j, : len(ids)] for j, ids in enumerate(items)]

    def encode(self, texts: Sequence[str], truncation: Truncation = CUT_RIGHT) -> list[TaggedText]:
        tagged = []
        for index, e in enumerate(encode_texts(self.tokenizer, texts)):
            ids, word_ids, offsets = list(e.ids), list(e.word_ids), list(e.offsets)
            kept = truncation.kept(len(ids), self.max_len, index)
            if kept is not None:  # [CLS] and the final [SEP] kept, as in training
                ids, word_ids, offsets = (
                    [ids[i] for i in kept],
                    [word_ids[i] for i in kept],
                    [offsets[i] for i in kept],
                )
            tagged.append(TaggedText(ids, kept is not None, word_ids, offsets))
        return tagged

    @property
    def default_aggregation(self) -> str:
        """The model's own grouping: "first" for the house tagger, "simple" for imported ones (its manifest)."""
        tagging = self.model.manifest.tagging
        return tagging.aggregation if tagging is not None else "first"

    def entities(
        self, text: str, tagged: TaggedText, logits: np.ndarray, aggregation: Aggregation | None = None
    ) -> Entities:
        if aggregation is not None:  # the caller's choice, as transformers defines it
            chosen = aggregate(logits, tagged.word_ids, tagged.offsets, self.labels, aggregation)
            found = [EntitySpan(text[e.start : e.end], e.label, e.start, e.end, e.score) for e in chosen]
            return Entities(found, tagged.truncated)
        tagging = self.model.manifest.tagging
        simple = tagging is not None and tagging.aggregation == "simple"
        if simple:  # every token its own tag
            tags, scores, spans = token_predictions(logits, tagged.word_ids, tagged.offsets, self.labels)
        else:
            tags, scores = word_predictions(logits, tagged.word_ids, self.labels)
            spans = word_char_spans(tagged.word_ids, tagged.offsets)
        found = [
            EntitySpan(text[e.start : e.end], e.label, e.start, e.end, e.score)
            for e in group_entities(tags, scores, spans, simple)
        ]
        return Entities(found, tagged.truncated)

    async def tag(
        self,
        texts: Sequence[str],
        truncation: Truncation = CUT_RIGHT,
        aggregation: Aggregation | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Entities]:
        tagged, logits = await self.run_texts(texts, truncation, meta)
        results = [
            self.entities(x, t, lg, aggregation) for x, t, lg in zip(texts, tagged, logits, strict=True)
        ]
        return Outcome(self.name, self.model.version, results, Usage(sum(len(t.ids) for t in tagged)))

    def attention_feeds(self, text: str, result: Entities) -> AttentionFeeds:
        return self.token_feeds(self.encode([text])[0].ids)

    async def warmup(self) -> None:
        await self.tag(["Ada Lovelace lived in London."])
