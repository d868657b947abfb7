"""POST /v1/translate."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_schema import exactly_one_of, json_body
from service.api.rest.schemas.attention import AttentionFields, AttentionOut, WithAttention
from service.api.rest.schemas.common import InferenceResponse, TextInput, ranged
from service.inference import Translation


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
    truncated: bool = Field(description="The source was cut to the model's max_source_length")

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
            attention=AttentionOut.of(t.attention),
        )


class TranslateResponse(InferenceResponse):
    results: list[TranslationOut]
