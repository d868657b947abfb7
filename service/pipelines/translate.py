"""Translation: tokenised sources -> KV-cached greedy or beam search, batched across requests.

One batch may hold requests with different decoding parameters. ``run_batch``
runs every greedy item of a batch in one ``Seq2SeqModel`` call (each row leaves
at its own step limit and carries its own controls), and groups beam-search
items by (beam_size, max_new_tokens, length_penalty, num_return_sequences), one
call per group; every item is decoded exactly as it would be alone (decoding
rows never interact). Scored pairs (``score``) run in one teacher-forced call.

Default ``max_new_tokens``: twice the source tokens plus 10 (a translation is
rarely longer; this stops degenerate repetition early), rounded up to a
multiple of 16 so requests of similar length share a group. Any value is
capped by MAX_NEW_TOKENS and by the model's own target length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.manifest import Manifest, required
from service.engine.repository import LoadedModel
from service.engine.seq2seq import FREE, Hypothesis, RowControls, Seq2SeqModel
from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta

from .attention import AttentionFeeds, decoded_labels
from .base import BatchedPipeline, Building, Workers
from .contract import Parameter, TaskContract, TensorSpec, text_input
from .documents import Document, TextFormat, document, plain
from .results import Outcome, Translation, TranslationScore, TranslationSequence, Usage
from .text_inputs import encode_texts, preprocess, truncate

_DEFAULT_LIMIT_STEP = 16


def prepare_source(
    manifest: Manifest, ids: Sequence[int], cap: int, max_new_tokens: int | None = None
) -> tuple[list[int], int, bool]:
    """A tokenised text as the translator takes it: (source ids, step limit, whether the text was cut).

    The source is the text's ids and the manifest's suffix (</s> unless it names one), cut to
    max_source_length keeping its last token; the step limit is ``max_new_tokens`` or the default
    described above, at most ``cap``. The service, the export's evaluation and the benchmarks all
    prepare sources here, so what is measured is what is served.
    """
    suffix = manifest.source_suffix if manifest.source_suffix is not None else [manifest.token("eos")]
    full = [*ids, *suffix]
    source = truncate(full, required(manifest.max_source_length))
    if max_new_tokens is None:
        max_new_tokens = -(-(2 * len(source) + 10) // _DEFAULT_LIMIT_STEP) * _DEFAULT_LIMIT_STEP
    return source, min(max_new_tokens, cap), len(full) > len(source)


@dataclass(frozen=True)
class DecodingParams:
    """How to decode; ``beam_size == 1`` is greedy search."""

    beam_size: int = 1
    max_new_tokens: int | None = None  # None: the per-source default described above
    length_penalty: float = 1.0
    num_return_sequences: int = 1
    # CTranslate2's controls (``translate_batch``); the defaults change nothing
    target_prefix: tuple[str | None, ...] = ()  # one per text (or one for every text): its forced start
    return_alternatives: bool = False  # num_hypotheses greedy continuations, branching after the prefix
    num_hypotheses: int = 1  # with return_alternatives: how many
    min_decoding_length: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    suppress_sequences: tuple[str, ...] = ()  # each tokenised as written, never produced

    def __post_init__(self) -> None:
        assert 1 <= self.num_return_sequences <= self.beam_size, (
            "num_return_sequences must be in 1..beam_size"
        )

    def prefix(self, index: int) -> str | None:
        """Text ``index``'s target prefix: its own, or the one given for every text."""
        if not self.target_prefix:
            return None
        return self.target_prefix[0] if len(self.target_prefix) == 1 else self.target_prefix[index]


@dataclass(frozen=True)
class SourceItem:
    """One source sentence in the queue, with the decoding parameters its group is keyed on."""

    ids: list[int]
    beam_size: int
    max_new_tokens: int
    length_penalty: float
    num_return_sequences: int
    controls: RowControls = FREE  # per row: shares its group's batch with free rows
    target: tuple[int, ...] | None = None  # scoring this translation instead of decoding (``score``)

    @property
    def group(self) -> tuple[int, int, float, int]:
        if self.target is not None:  # every scored pair of a batch in one teacher-forced call
            return (0, 0, 0.0, 0)
        if self.beam_size == 1:  # greedy rows leave at their own limits: one call for all of them
            return (1, 0, 1.0, 1)
        return (self.beam_size, self.max_new_tokens, self.length_penalty, self.num_return_sequences)


class Translator(BatchedPipeline[SourceItem, list[Hypothesis]]):
    contract = TaskContract(
        "translation",
        "translator",
        (text_input("text", "UTF-8 English text"),),
        (
            TensorSpec(
                "translation",
                "BYTES",
                "the German translation (best hypothesis)",
                value=lambda t: t.sequences[0].text,
            ),
            TensorSpec(
                "finish_reason", "BYTES", "eos | length", value=lambda t: t.sequences[0].finish_reason
            ),
            TensorSpec(
                "score",
                "FP32",
                "length-penalised log-probability (beam) or mean token log-probability",
                value=lambda t: t.sequences[0].score,
            ),
        ),
        (
            Parameter("beam_size", "int", "1 = greedy search (default)"),
            Parameter(
                "max_new_tokens",
                "int",
                "at most MAX_NEW_TOKENS; default from the source length",
                ("max_new_tokens", "max_tokens"),
            ),
            Parameter("length_penalty", "float", "beam score = log-prob / length ** length_penalty"),
        ),
    )

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> Translator:
        return cls(
            model,
            building.policy(),
            building.settings.max_new_tokens,
            building.batcher_observer(model.name),
            building.workers,
        )

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        max_new_tokens: int,
        observer: BatcherObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        assert model.tokenizer is not None, "text model without a tokenizer"
        manifest = model.manifest
        self.tokenizer = model.tokenizer
        self.seq2seq = Seq2SeqModel(
            model.graphs["encoder"], model.graphs["decoder"], manifest, model.inplace.get("decoder")
        )
        self.max_new_tokens = min(max_new_tokens, self.seq2seq.max_new_tokens)
        self.bos, self.eos = manifest.decoder_start, manifest.token("eos")

    def run_batch(self, items: list[SourceItem]) -> Sequence[list[Hypothesis] | BaseException]:
        groups: dict[tuple[int, int, float, int], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item.group, []).append(i)
        results: list[list[Hypothesis] | BaseException] = [[] for _ in items]
        for (beam, limit, penalty, num_return), indices in groups.items():
            sources = [items[i].ids for i in indices]
            controls = [items[i].controls for i in indices]
            hypotheses: Sequence[list[Hypothesis] | BaseException]
            try:
                if beam == 0:
                    hypotheses = [
                        [self._scored(items[i], lp)]
                        for i, lp in zip(indices, self._score(indices, items), strict=True)
                    ]
                elif beam == 1:
                    limits = [items[i].max_new_tokens for i in indices]
                    hypotheses = [[h] for h in self.seq2seq.greedy(sources, limits, controls)]
                else:
                    hypotheses = self.seq2seq.beam_search(sources, beam, limit, penalty, num_return, controls)
            except Exception as exc:  # one group failing must not fail the other groups of the batch
                hypotheses = [exc] * len(indices)
            for i, h in zip(indices, hypotheses, strict=True):
                results[i] = h
        return results

    def _score(self, indices: list[int], items: list[SourceItem]) -> list[np.ndarray]:
        return self.seq2seq.score(
            [items[i].ids for i in indices], [list(items[i].target or ()) for i in indices]
        )

    @staticmethod
    def _scored(item: SourceItem, lp: np.ndarray) -> Hypothesis:
        tokens = list(item.target or ())
        total = float(lp.sum())
        return Hypothesis(tokens, total, total / (len(tokens) + 1), True, [float(x) for x in lp])

    async def score(
        self, texts: Sequence[str], translations: Sequence[str], meta: RequestMeta = ANONYMOUS
    ) -> Outcome[TranslationScore]:
        """CTranslate2's ``score_batch``: each translation's log-probability given its text, per token (</s>
        last) and in total; every pair one item of the batch queue (scored pairs share a batch with
        translations, in a teacher-forced call of their own)."""
        with self.batcher.reserve(len(texts), meta) as permit:
            prepared = await preprocess(sum(map(len, texts)), self.prepare, texts, DecodingParams())
            items: list[SourceItem] = []
            for (item, _), translation in zip(prepared, translations, strict=True):
                ids = self._ids(translation)
                if len(ids) + 1 > self.seq2seq.max_new_tokens:
                    raise InvalidInputError(
                        f"{len(ids)} tokens; at most {self.seq2seq.max_new_tokens - 1} (the model's target length)",
                        "translations",
                        "too_long",
                        len(items),
                    )
                items.append(dataclasses.replace(item, target=tuple(ids)))
            outputs = await self.infer(items, [len(item.ids) for item in items], permit, meta)
        results = []
        for (_, truncated), (h,) in zip(prepared, outputs, strict=True):
            labels = [self.tokenizer.id_to_token(t) or "" for t in [*h.tokens, self.eos]]
            results.append(
                TranslationScore(
                    labels, list(h.token_logprobs or []), h.logprob, len(h.tokens) + 1, truncated
                )
            )
        usage = Usage(input_tokens=sum(len(i.ids) + len(i.target or ()) + 1 for i in items), output_tokens=0)
        return Outcome(self.name, self.model.version, results, usage)

    def prepare(
        self, texts: Sequence[str], params: DecodingParams, prefixes: Sequence[str | None] | None = None
    ) -> list[tuple[SourceItem, bool]]:
        """One queue item per text; ``prefixes``: each text's target prefix (None: free). With
        ``return_alternatives`` a text with a prefix is ``num_hypotheses`` greedy items (``_expanded``)."""
        prepared = []
        controls = self._controls(params)
        for i, encoding in enumerate(encode_texts(self.tokenizer, texts)):
            prefix = prefixes[i] if prefixes is not None else None
            row = controls
            if prefix is not None:
                row = dataclasses.replace(row, prefix=tuple(self._ids(prefix)))
            ids, limit, truncated = prepare_source(
                self.model.manifest, encoding.ids, self.max_new_tokens, params.max_new_tokens
            )
            if row.prefix and params.max_new_tokens is None:  # the default length counts after the prefix
                limit = min(limit + len(row.prefix), self.max_new_tokens)
            if len(row.prefix) >= limit:
                raise InvalidInputError(
                    f"{len(row.prefix)} tokens; the output's length limit is {limit} (max_new_tokens)",
                    "target_prefix",
                    "too_long",
                )
            beam, returns = params.beam_size, params.num_return_sequences
            if params.return_alternatives and prefix is not None:
                beam, returns = 1, 1
            item = SourceItem(ids, beam, limit, params.length_penalty, returns, row)
            prepared.append((item, truncated))
        return prepared

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _controls(self, params: DecodingParams) -> RowControls:
        return RowControls(
            min_length=params.min_decoding_length,
            no_repeat_ngram_size=params.no_repeat_ngram_size,
            repetition_penalty=params.repetition_penalty,
            suppress_sequences=tuple(tuple(self._ids(t)) for t in params.suppress_sequences if self._ids(t)),
        )

    def _sequence(self, h: Hypothesis) -> TranslationSequence:
        text = self.tokenizer.decode(h.tokens, skip_special_tokens=True)
        finish = "eos" if h.finished else "length"
        return TranslationSequence(text, float(h.score), finish, len(h.tokens), [int(t) for t in h.tokens])

    def documents(self, texts: Sequence[str], text_format: TextFormat, split: bool) -> list[Document]:
        """Each text as the sentences it is translated as (``documents.py``); an HTML text that cannot be
        parsed names its index."""
        out = []
        for index, text in enumerate(texts):
            try:
                out.append(document(text, text_format, split))
            except InvalidInputError as exc:
                raise InvalidInputError(exc.message, exc.field, exc.reason, index) from exc
        return out

    async def translate(
        self,
        texts: Sequence[str],
        params: DecodingParams,
        documents: Sequence[Document] | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Translation]:
        """Every sentence of every document is one item of the batch queue: a paragraph's sentences are
        batched together (and with other requests'), not queued one after another. Without
        ``documents``, each text is translated whole, as one sentence."""
        docs = list(documents) if documents is not None else [plain(t, split=False) for t in texts]
        sentences = [s for d in docs for s in d.sentences]
        # A text's target prefix (and its alternatives) go to its first sentence; "" is a prefix too
        # (alternatives branching at the first token).
        prefixes: list[str | None] = []
        for index, doc in enumerate(docs):
            prefix = params.prefix(index)
            if prefix is None and params.return_alternatives:
                prefix = ""
            prefixes += [prefix] + [None] * (len(doc.sentences) - 1) if doc.sentences else []
        picks = params.num_hypotheses if params.return_alternatives else 1
        outputs: list[list[Hypothesis]] = []
        prepared: list[tuple[SourceItem, bool]] = []
        if sentences:
            places = sum(picks if p is not None else 1 for p in prefixes)
            with self.batcher.reserve(places, meta) as permit:  # a full queue refuses before tokenising
                prepared = await preprocess(
                    sum(map(len, sentences)), self.prepare, sentences, params, prefixes
                )
                items, owner = self._expanded(prepared, prefixes, picks)
                done = await self.infer(
                    items, [len(item.ids) * item.beam_size for item in items], permit, meta
                )
            outputs = [[] for _ in sentences]
            for sentence, found in zip(owner, done, strict=True):
                outputs[sentence] += found
        results, at = [], 0
        for doc in docs:
            n = len(doc.sentences)
            hyps, cut = outputs[at : at + n], any(t for _, t in prepared[at : at + n])
            at += n
            results.append(self._document(doc, hyps, cut))
        usage = Usage(
            input_tokens=sum(len(item.ids) for item, _ in prepared),
            output_tokens=sum(len(h.tokens) for hyps in outputs for h in hyps),
        )
        return Outcome(self.name, self.model.version, results, usage)

    @staticmethod
    def _expanded(
        prepared: list[tuple[SourceItem, bool]], prefixes: list[str | None], picks: int
    ) -> tuple[list[SourceItem], list[int]]:
        """The queue's items and the sentence each answers: with return_alternatives, a sentence with a
        prefix is ``picks`` greedy rows taking the 1st, 2nd... most likely token after it (CTranslate2's
        alternatives at the end of the prefix), continued greedily."""
        items, owner = [], []
        for sentence, ((item, _), prefix) in enumerate(zip(prepared, prefixes, strict=True)):
            count = picks if prefix is not None and picks > 1 else 1
            for pick in range(count):
                items.append(
                    dataclasses.replace(item, controls=dataclasses.replace(item.controls, pick=pick))
                )
                owner.append(sentence)
        return items, owner

    def _document(self, doc: Document, hyps: list[list[Hypothesis]], truncated: bool) -> Translation:
        """Sequence i of a document joins each sentence's i-th hypothesis; its score is the mean of theirs,
        its finish reason ``length`` if any sentence was cut by the step limit. One sentence: that
        sentence's own sequences, its surrounding whitespace kept."""
        if not hyps:  # nothing to translate (HTML without text): the document as it was
            return Translation([TranslationSequence(doc.join([]), 0.0, "eos", 0, [])], truncated, sentences=0)
        sequences = []
        for i in range(max(len(h) for h in hyps)):  # num_return_sequences of them (beam: up to)
            parts = [self._sequence(h[min(i, len(h) - 1)]) for h in hyps]
            sequences.append(
                TranslationSequence(
                    doc.join([p.text for p in parts]),
                    sum(p.score for p in parts) / len(parts),
                    "length" if any(p.finish_reason == "length" for p in parts) else "eos",
                    sum(p.tokens for p in parts),
                    [t for p in parts for t in p.token_ids],
                )
            )
        return Translation(sequences, truncated, sentences=len(hyps))

    def attention_params(self, text: str, params: DecodingParams, max_tokens: int) -> DecodingParams:
        """A map's rows are the produced tokens: at most ``max_tokens`` - 1 new ones (the default is capped
        there; a larger ``max_new_tokens`` is refused)."""
        limit = params.max_new_tokens
        if limit is not None and limit > max_tokens - 1:
            raise InvalidInputError(
                f"{limit}; with return_attention at most {max_tokens - 1} (ATTENTION_MAX_TOKENS - 1)",
                "max_new_tokens",
                "out_of_range",
            )
        ((item, _),) = self.prepare([text], params)
        return dataclasses.replace(params, max_new_tokens=min(item.max_new_tokens, max_tokens - 1))

    def attention_length(self, text: str) -> tuple[int, str]:
        ((item, _),) = self.prepare([text], DecodingParams())
        return len(item.ids), "inputs"

    def attention_feeds(self, text: str, result: Translation) -> AttentionFeeds:
        """Teacher-force the best translation after the source; row i is the step that produced target
        token i (cross-attention: target tokens x source tokens)."""
        ((item, _),) = self.prepare([text], DecodingParams())
        source, best = item.ids, result.sequences[0]
        produced = (
            [*best.token_ids, self.eos]
            if best.finish_reason == "eos" or not best.token_ids
            else best.token_ids
        )
        feeds = {
            "input_ids": np.array([source], dtype=np.int64),
            "attention_mask": np.ones((1, len(source)), dtype=np.int64),
            "decoder_input_ids": np.array([[self.bos, *produced[:-1]]], dtype=np.int64),
        }
        return AttentionFeeds(
            feeds, "cross", decoded_labels(self.tokenizer, produced), decoded_labels(self.tokenizer, source)
        )

    async def warmup(self) -> None:
        await self.translate(["warm-up"], DecodingParams(max_new_tokens=2))
