"""Translation: tokenised sources -> KV-cached greedy or beam search, batched across requests.

One batch may hold requests with different decoding parameters. ``run_batch``
groups its items by (beam_size, max_new_tokens, length_penalty,
num_return_sequences) and runs one ``Seq2SeqModel`` call per group, so every
item is decoded exactly as it would be alone (decoding rows never interact).

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
from service.engine.seq2seq import Hypothesis, Seq2SeqModel
from service.errors import InvalidInputError

from .attention import AttentionFeeds, decoded_labels
from .base import BatchedPipeline, Building
from .contract import Parameter, TaskContract, TensorSpec, text_input
from .results import Outcome, Translation, TranslationSequence, Usage
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

    def __post_init__(self) -> None:
        assert 1 <= self.num_return_sequences <= self.beam_size, (
            "num_return_sequences must be in 1..beam_size"
        )


@dataclass(frozen=True)
class SourceItem:
    """One source sentence in the queue, with the decoding parameters its group is keyed on."""

    ids: list[int]
    beam_size: int
    max_new_tokens: int
    length_penalty: float
    num_return_sequences: int

    @property
    def group(self) -> tuple[int, int, float, int]:
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
            model, building.policy(), building.settings.max_new_tokens, building.batcher_observer(model.name)
        )

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        max_new_tokens: int,
        observer: BatcherObserver | None = None,
    ) -> None:
        super().__init__(model, policy, observer)
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
            hypotheses: Sequence[list[Hypothesis] | BaseException]
            try:
                if beam == 1:
                    hypotheses = [[h] for h in self.seq2seq.greedy(sources, limit)]
                else:
                    hypotheses = self.seq2seq.beam_search(sources, beam, limit, penalty, num_return)
            except Exception as exc:  # one group failing must not fail the other groups of the batch
                hypotheses = [exc] * len(indices)
            for i, h in zip(indices, hypotheses, strict=True):
                results[i] = h
        return results

    def prepare(self, texts: Sequence[str], params: DecodingParams) -> list[tuple[SourceItem, bool]]:
        prepared = []
        for encoding in encode_texts(self.tokenizer, texts):
            ids, limit, truncated = prepare_source(
                self.model.manifest, encoding.ids, self.max_new_tokens, params.max_new_tokens
            )
            item = SourceItem(
                ids, params.beam_size, limit, params.length_penalty, params.num_return_sequences
            )
            prepared.append((item, truncated))
        return prepared

    def _sequence(self, h: Hypothesis) -> TranslationSequence:
        text = self.tokenizer.decode(h.tokens, skip_special_tokens=True)
        finish = "eos" if h.finished else "length"
        return TranslationSequence(text, float(h.score), finish, len(h.tokens), [int(t) for t in h.tokens])

    async def translate(self, texts: Sequence[str], params: DecodingParams) -> Outcome[Translation]:
        with self.batcher.reserve(
            len(texts)
        ) as permit:  # a full queue refuses before tokenisation is paid for
            prepared = await preprocess(sum(map(len, texts)), self.prepare, texts, params)
            items = [item for item, _ in prepared]
            outputs = await self.infer(items, [len(item.ids) * item.beam_size for item in items], permit)
        results = [
            Translation([self._sequence(h) for h in hyps], truncated)
            for hyps, (_, truncated) in zip(outputs, prepared, strict=True)
        ]
        usage = Usage(
            input_tokens=sum(len(item.ids) for item in items),
            output_tokens=sum(s.tokens for r in results for s in r.sequences),
        )
        return Outcome(self.name, self.model.version, results, usage)

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
