"""TEI's request bodies (``router/src/http/types.rs``), plus ``model``: which served model answers (TEI serves
one; here the task's default unless named)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, Text, json_body
from service.api.http.fields import FieldNames, one_or_many
from service.inference import CUT_RIGHT, DOCUMENTS, INPUTS, QUERIES, Truncation


def _direction(value: Any) -> Any:
    """TEI takes ``Left``/``left`` and ``Right``/``right``."""
    return value.lower() if isinstance(value, str) and value.lower() in ("left", "right") else value


class TeiRequest(NoBooleanNumbers):
    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        default=None, description="Served model name; default: the task's default"
    )
    truncate: bool | None = Field(
        default=None,
        description="true or null (this service's default): a text longer than the model's window is cut "
        "to it; false: such a text is refused (422), as TEI does without --auto-truncate",
    )
    truncation_direction: Literal["left", "right"] = Field(
        default="right", description="Which end of a long text is cut: right (its end) or left (its start)"
    )

    _direction = field_validator("truncation_direction", mode="before")(_direction)

    @property
    def truncation(self) -> Truncation:
        if self.truncate is None and self.truncation_direction == "right":
            return CUT_RIGHT
        return Truncation(self.truncate is not False, self.truncation_direction)


class RerankRequest(TeiRequest):
    """TEI's ``POST /rerank``."""

    query: Text = Field(description="The query")
    texts: list[str] = Field(min_length=1, description="The texts to rank (at most MAX_ITEMS)")
    raw_scores: bool = Field(
        default=False,
        description="A reranker's logits before the sigmoid; an embedder's cosine is the same either way",
    )
    return_text: bool = Field(default=False, description="Each rank carries its text")

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(self.query, text) for text in self.texts]

    def field_names(self) -> FieldNames:
        return FieldNames(
            {QUERIES: "query", DOCUMENTS: "texts[{i}]", INPUTS: "texts[{i}]"},
            {QUERIES: "query", DOCUMENTS: "texts", INPUTS: "texts"},
        )


RerankBody = Annotated[RerankRequest, json_body(RerankRequest)]


class Rank(BaseModel):
    index: int
    text: str | None = None
    score: float


def _no_token_ids(value: Any) -> Any:
    """TEI also takes token ids; this service takes text only (its tokenizer is applied here)."""
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, int) or (isinstance(v, list) and v and isinstance(v[0], int)) for v in items):
        raise PydanticCustomError("unsupported", "token-id input is not supported: send text")
    if isinstance(value, list) and not value:
        raise PydanticCustomError("too_short", "`inputs` cannot be empty")
    return value


class Inputs(BaseModel):
    """``inputs``: one text or a batch (at most MAX_ITEMS); answers are always a list, one per text."""

    inputs: str | list[str] = Field(description="One text or a batch of texts")

    _inputs = field_validator("inputs", mode="before")(_no_token_ids)

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    def field_names(self) -> FieldNames:
        return one_or_many("inputs", "inputs", isinstance(self.inputs, str))


class TextsRequest(TeiRequest, Inputs):
    """A request of texts for an encoder task, with TEI's truncation fields."""


class EmbedRequest(TextsRequest):
    """TEI's ``POST /embed``."""

    normalize: bool = Field(default=True, description="Unit-length vectors (false: the mean-pooled states)")
    dimensions: int | None = Field(default=None, ge=1, description="Only the model's own size")
    prompt_name: str | None = Field(default=None, description="Not supported: the model has no prompts")

    @model_validator(mode="after")
    def _no_prompt(self) -> EmbedRequest:
        if self.prompt_name is not None:
            raise PydanticCustomError(
                "unsupported",
                "prompt_name is not supported: the model has no prompts",
                {"field": "prompt_name"},
            )
        return self


EmbedBody = Annotated[EmbedRequest, json_body(EmbedRequest)]


class PredictRequest(TeiRequest):
    """TEI's ``POST /predict``: a text, a sentence pair ``[a, b]``, or a batch of ``[a]`` / ``[a, b]`` items."""

    inputs: Any = Field(description="A string, a pair of strings, or a batch of one- or two-string lists")
    raw_scores: bool = Field(default=False, description="Not supported: the classifier answers probabilities")

    @field_validator("inputs", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            kind = "too_short" if value == [] else "type_error"
            raise PydanticCustomError(
                kind, "a string, a pair of strings, or a batch of one- or two-string lists"
            )
        if all(isinstance(v, str) for v in value):
            if len(value) > 2:
                raise PydanticCustomError("not_a_pair", "a pair is two strings; a batch is a list of lists")
            return value
        return value

    @model_validator(mode="after")
    def _probabilities(self) -> PredictRequest:
        if not self.single:
            for index, item in enumerate(self.inputs):
                if not (
                    isinstance(item, list) and 1 <= len(item) <= 2 and all(isinstance(t, str) for t in item)
                ):
                    raise PydanticCustomError(
                        "not_a_pair",
                        "a one-string list (a text) or a two-string list (a sentence pair)",
                        {"field": f"inputs[{index}]"},
                    )
        if self.raw_scores:
            raise PydanticCustomError(
                "unsupported",
                "raw_scores is not supported: the classifier answers probabilities",
                {"field": "raw_scores"},
            )
        return self

    @property
    def single(self) -> bool:
        """One input (a text or one pair): the answer is one list of labels, not a list of them."""
        return isinstance(self.inputs, str) or all(isinstance(v, str) for v in self.inputs)

    @property
    def items(self) -> list[tuple[str, str | None]]:
        if isinstance(self.inputs, str):
            return [(self.inputs, None)]
        rows = [self.inputs] if self.single else self.inputs
        return [(row[0], row[1] if len(row) == 2 else None) for row in rows]

    @property
    def has_pairs(self) -> bool:
        return any(b is not None for _, b in self.items)

    def field_names(self) -> FieldNames:
        return one_or_many("inputs", "inputs", self.single)


PredictBody = Annotated[PredictRequest, json_body(PredictRequest)]


class TokenizeRequest(NoBooleanNumbers, Inputs):
    """TEI's ``POST /tokenize``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(default=None, description="Any text model; default: the default embedder")
    add_special_tokens: bool = Field(default=True, description="With the model's [CLS]/[SEP] (or its own)")
    prompt_name: None = Field(default=None, description="Not supported")


TokenizeBody = Annotated[TokenizeRequest, json_body(TokenizeRequest)]


class DecodeRequest(NoBooleanNumbers):
    """TEI's ``POST /decode``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(default=None, description="Any text model; default: the default embedder")
    ids: list[int] | list[list[int]] = Field(description="One row of token ids, or a batch of rows")
    skip_special_tokens: bool = Field(default=True)

    @field_validator("ids", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value == []:
            raise PydanticCustomError("too_short", "`ids` cannot be empty")
        return value

    @property
    def single(self) -> bool:
        return bool(self.ids) and isinstance(self.ids[0], int)

    @property
    def rows(self) -> list[list[int]]:
        return [list(self.ids)] if self.single else [list(r) for r in self.ids]  # type: ignore[arg-type]

    def field_names(self) -> FieldNames:
        return FieldNames({} if self.single else {"ids": "ids[{i}]"}, {"ids": "ids"})


DecodeBody = Annotated[DecodeRequest, json_body(DecodeRequest)]


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source_sentence: Text
    sentences: list[str] = Field(min_length=1)


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    truncate: bool | None = None
    truncation_direction: Literal["left", "right"] = "right"
    prompt_name: None = None

    _direction = field_validator("truncation_direction", mode="before")(_direction)


class SimilarityRequest(NoBooleanNumbers):
    """TEI's ``POST /similarity``: the cosine of ``source_sentence``'s embedding with each sentence's."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(default=None, description="An embedder; default: the default embedder")
    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None

    @property
    def truncation(self) -> Truncation:
        p = self.parameters or SimilarityParameters()
        if p.truncate is None and p.truncation_direction == "right":
            return CUT_RIGHT
        return Truncation(p.truncate is not False, p.truncation_direction)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(self.inputs.source_sentence, s) for s in self.inputs.sentences]

    def field_names(self) -> FieldNames:
        return FieldNames(
            {QUERIES: "inputs.source_sentence", DOCUMENTS: "inputs.sentences[{i}]"},
            {QUERIES: "inputs.source_sentence", DOCUMENTS: "inputs.sentences"},
        )


SimilarityBody = Annotated[SimilarityRequest, json_body(SimilarityRequest)]
