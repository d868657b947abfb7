"""POST /v1/translate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_schema import Text, exactly_one_of, json_body
from service.api.http.fields import FieldNames
from service.api.rest.schemas.attention import AttentionFields, AttentionOut, WithAttention
from service.api.rest.schemas.common import InferenceResponse, TextInput, ranged
from service.inference import Translation, TranslationScore

Prefix = Annotated[str, Field(max_length=512)]


class TranslateRequest(TextInput, AttentionFields):
    beam_size: int = ranged("beam_size", 1, "1: greedy search; 2..8: beam search")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="At most MAX_NEW_TOKENS; default: 2 x source tokens + 10, rounded up to a multiple of 16; "
        "capped by the model's target length",
    )
    num_return_sequences: int = ranged("num_return_sequences", 1, "Best hypotheses to return, <= beam_size")
    length_penalty: float = ranged("length_penalty", 1.0, "Beam score = log-prob / length ** length_penalty")
    return_scores: bool = Field(default=False, description="Include each sequence's score")
    format: Literal["text", "html"] = Field(
        default="text",
        description="html: only the text nodes are translated; tags, attributes, comments and the text of "
        'script, style, code, pre and translate="no" elements come back unchanged',
    )
    split_sentences: bool = Field(
        default=True,
        description="Split each text into sentences (sentencex), translate them as one batch and rejoin them "
        "with the text's own whitespace and line breaks; each sentence counts as an item (MAX_ITEMS)",
    )
    # CTranslate2's decoding controls (translate_batch), by its names
    target_prefix: Prefix | list[Prefix | None] | None = Field(
        None,
        description="CTranslate2's target_prefix: the translation's forced start, tokenised as written (one "
        "string for every text, or a list with one per text, null: free); with split_sentences it applies "
        "to each text's first sentence. It counts in max_new_tokens when that is given",
    )
    return_alternatives: bool = Field(
        default=False,
        description="CTranslate2's return_alternatives: num_hypotheses alternatives branching at the first "
        "position after target_prefix (the 1st, 2nd... most likely token there), each continued greedily; "
        "in sequences, in that order",
    )
    num_hypotheses: int | None = Field(
        None,
        ge=1,
        le=8,
        description="With return_alternatives: how many alternatives; without: CTranslate2's n-best, the same "
        "as num_return_sequences (at most beam_size)",
    )
    max_decoding_length: int | None = Field(
        None, ge=1, description="CTranslate2's name for max_new_tokens (give one of the two)"
    )
    min_decoding_length: int = Field(
        default=0, ge=0, le=1024, description="No </s> before this many tokens (the prefix's included)"
    )
    no_repeat_ngram_size: int = Field(
        default=0, ge=0, le=32, description="No n-gram of this size twice in a translation (0: off)"
    )
    repetition_penalty: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="CTRL's penalty on the tokens already in the translation: their logits / p if positive, "
        "x p if not (1: off)",
    )
    suppress_sequences: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None,
        max_length=32,
        description="Texts never produced, each tokenised as written (a word inside a sentence starts with a "
        'space: " Hund"); a one-token text is banned outright, a longer one by banning its last token '
        "after the others",
    )

    @model_validator(mode="after")
    def _ctranslate2_names(self) -> TranslateRequest:
        if self.max_decoding_length is not None:
            if self.max_new_tokens is not None and self.max_new_tokens != self.max_decoding_length:
                raise PydanticCustomError(
                    "conflict",
                    "give max_new_tokens or max_decoding_length, not both",
                    {"field": "max_decoding_length"},
                )
            self.max_new_tokens = self.max_decoding_length
        if self.num_hypotheses is not None and not self.return_alternatives:
            if (
                "num_return_sequences" in self.model_fields_set
                and self.num_return_sequences != self.num_hypotheses
            ):
                raise PydanticCustomError(
                    "conflict",
                    "give num_return_sequences or num_hypotheses, not both",
                    {"field": "num_hypotheses"},
                )
            self.num_return_sequences = self.num_hypotheses
        if isinstance(self.target_prefix, list) and len(self.target_prefix) != len(self.inputs):
            raise PydanticCustomError(
                "out_of_range",
                "a list of target prefixes has one per text ({n} texts, {p} prefixes)",
                {"n": len(self.inputs), "p": len(self.target_prefix), "field": "target_prefix"},
            )
        return self

    @property
    def prefixes(self) -> tuple[str | None, ...]:
        if self.target_prefix is None:
            return ()
        return (self.target_prefix,) if isinstance(self.target_prefix, str) else tuple(self.target_prefix)

    @property
    def returned(self) -> int:
        """The sequences each result has: the alternatives, or the n-best."""
        return (self.num_hypotheses or 1) if self.return_alternatives else self.num_return_sequences

    @model_validator(mode="after")
    def _returns_fit_the_beam(self) -> TranslateRequest:
        if self.num_return_sequences > self.beam_size:
            raise PydanticCustomError(
                "out_of_range",
                "num_return_sequences ({n}) must not exceed beam_size ({k})",
                {"n": self.num_return_sequences, "k": self.beam_size, "field": "num_return_sequences"},
            )
        return self


TranslateBody = Annotated[TranslateRequest, json_body(TranslateRequest, exactly_one_of("text", "texts"))]


class TranslationSequenceOut(BaseModel):
    text: str
    finish_reason: str = Field(description="eos | length")
    score: float | None = Field(
        None,
        description="With return_scores: length-penalised log-probability (beam) or mean token log-probability "
        "(greedy)",
    )


class TranslationOut(WithAttention):
    text: str = Field(description="The best translation")
    finish_reason: str = Field(description="eos | length")
    score: float | None = None
    sequences: list[TranslationSequenceOut] | None = Field(
        None, description="All num_return_sequences hypotheses, best first (only when it is > 1)"
    )
    truncated: bool = Field(description="A sentence of the source was cut to the model's max_source_length")
    sentences: int = Field(description="The sentences the text was translated as")

    @classmethod
    def of(cls, t: Translation, num_return: int, scores: bool) -> TranslationOut:
        seqs = [
            TranslationSequenceOut(
                text=s.text, finish_reason=s.finish_reason, score=s.score if scores else None
            )
            for s in t.sequences
        ]
        best = seqs[0]
        return cls(
            text=best.text,
            finish_reason=best.finish_reason,
            score=best.score,
            sequences=seqs if num_return > 1 else None,
            truncated=t.truncated,
            sentences=t.sentences,
            attention=AttentionOut.of(t.attention),
        )


class TranslateResponse(InferenceResponse):
    results: list[TranslationOut]


class ScoreRequest(TextInput):
    """CTranslate2's ``score_batch``: ``text`` with ``translation``, or ``texts`` with ``translations``."""

    translation: Text | None = Field(default=None, description="The translation of text to score")
    translations: list[Text] | None = Field(
        None, min_length=1, description="One translation per text of texts, to score"
    )

    @model_validator(mode="after")
    def _pairs(self) -> ScoreRequest:
        single = self.text is not None
        given, field = (self.translation, "translation") if single else (self.translations, "translations")
        other = "translations" if single else "translation"
        if given is None or getattr(self, other) is not None:
            raise PydanticCustomError(
                "one_input",
                "text goes with translation, texts with translations",
                {"field": field},
            )
        if not single and len(self.translations or []) != len(self.inputs):
            raise PydanticCustomError(
                "out_of_range",
                "one translation per text ({n} texts, {t} translations)",
                {"n": len(self.inputs), "t": len(self.translations or []), "field": "translations"},
            )
        return self

    @property
    def targets(self) -> list[str]:
        return [self.translation] if self.translation is not None else list(self.translations or [])

    def field_names(self) -> FieldNames:
        if self.text is not None:
            return FieldNames(
                {"inputs": "text", "translations": "translation"},
                {"inputs": "text", "translations": "translation"},
            )
        return FieldNames({"inputs": "texts[{i}]", "translations": "translations[{i}]"}, {"inputs": "texts"})


ScoreBody = Annotated[ScoreRequest, json_body(ScoreRequest, exactly_one_of("text", "texts"))]


class ScoreOut(BaseModel):
    tokens: list[str] = Field(description="The translation's tokens as the vocabulary spells them, </s> last")
    token_logprobs: list[float] = Field(
        description="Each token's log-probability given the source and the tokens before it"
    )
    logprob: float = Field(description="Their sum: the translation's log-probability")
    length: int = Field(description="The number of tokens, </s> included")
    truncated: bool = Field(description="The source was cut to the model's max_source_length")

    @classmethod
    def of(cls, s: TranslationScore) -> ScoreOut:
        return cls.model_validate(s, from_attributes=True)


class ScoreResponse(InferenceResponse):
    results: list[ScoreOut]
