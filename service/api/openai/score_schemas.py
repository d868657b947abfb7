"""The bodies of vLLM's pair-scoring routes: ``/v1/rerank`` and ``/v2/rerank`` in Cohere's and Jina's shape,
``/v1/score`` in vLLM's. Each turns its body into the core's (query, document) pairs and says what the
core's ``queries`` and ``documents`` are called in it, for the errors.

Parameters this service cannot honour are refused with a 400 naming them (``rank_fields``,
``max_chunks_per_doc``, ``max_tokens_per_doc``), never ignored; unknown fields too.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, Text, exactly_one_of, json_body
from service.api.http.fields import FieldNames
from service.api.openai.schemas import Scheduled
from service.inference import DOCUMENTS, QUERIES


def _document_texts(value: Any) -> Any:
    """Cohere's and Jina's documents: strings, or ``{"text": ...}`` objects, read as their text."""
    if not isinstance(value, list):
        return value
    texts = []
    for index, item in enumerate(value):
        if isinstance(item, dict):
            if set(item) != {"text"} or not isinstance(item["text"], str):
                raise PydanticCustomError(
                    "document",
                    'documents[{index}] must be a string or {{"text": string}}',
                    {"field": f"documents[{index}]", "index": index},
                )
            item = item["text"]
        texts.append(item)
    return texts


# A document is a string or {"text": string}; blank ones are the core's error, naming documents[i].
Documents = Annotated[
    list[str],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "properties": {"text": {"type": "string"}},
                        "required": ["text"],
                        "additionalProperties": False,
                    },
                ]
            },
        }
    ),
]


class RerankRequest(Scheduled, NoBooleanNumbers):
    """Cohere's ``POST /v1/rerank`` / ``/v2/rerank`` body, which Jina's and vLLM's share."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        default=None,
        description="A rerank model, or an embedder (it scores by cosine); default: the rerank task's "
        "default model, else the default embedder",
    )
    query: Text = Field(description="The search query (at most MAX_TEXT_CHARS characters)")
    documents: Documents = Field(
        min_length=1,
        description='The texts to rank against the query, as strings or `{"text": ...}` (at most '
        "MAX_ITEMS, each at most MAX_TEXT_CHARS characters)",
    )
    top_n: int | None = Field(
        default=None, ge=1, description="Return the best top_n documents (default: all, best first)"
    )
    return_documents: bool = Field(
        default=True, description='Each result carries its document as `{"text": ...}` (as Jina and vLLM)'
    )
    rank_fields: list[str] | None = Field(default=None, description="Not supported: documents are plain text")
    max_chunks_per_doc: int | None = Field(default=None, description="Not supported")
    max_tokens_per_doc: int | None = Field(
        default=None, description="Not supported: a document longer than the model's window is cut to it"
    )

    _documents = field_validator("documents", mode="before")(_document_texts)

    @model_validator(mode="after")
    def _supported(self) -> RerankRequest:
        for name in ("rank_fields", "max_chunks_per_doc", "max_tokens_per_doc"):
            if getattr(self, name) is not None:
                raise PydanticCustomError(
                    "unsupported",
                    "{field} is not supported: leave it out (documents are plain text, cut to the model's window)",
                    {"field": name},
                )
        return self

    @property
    def texts(self) -> list[str]:
        return list(self.documents)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(self.query, text) for text in self.texts]

    def field_names(self) -> FieldNames:
        return FieldNames(
            {QUERIES: "query", DOCUMENTS: "documents[{i}]"}, {QUERIES: "query", DOCUMENTS: "documents"}
        )


RerankBody = Annotated[RerankRequest, json_body(RerankRequest)]


class RerankDocumentOut(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="The document's position in the request")
    relevance_score: float = Field(description="Its score: cosine when `scored_by` is cosine")
    document: RerankDocumentOut | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str = Field(description="The model that scored")
    scored_by: str = Field(description="`cosine`: the embedder's vectors (no reranker served)")
    results: list[RerankResult] = Field(description="Best first")
    usage: RerankUsage


Texts = str | list[str]  # blank texts are the core's error, naming the field and index


def _not_empty(value: Any) -> Any:
    if isinstance(value, list) and not value:
        raise PydanticCustomError("too_short", "must hold at least one text")
    return value


class ScoreRequest(Scheduled, NoBooleanNumbers):
    """vLLM's ``POST /v1/score``: ``text_1`` / ``text_2`` (or ``queries`` / ``documents``). One query (a
    string or a one-item list) is scored against every document; lists of equal length pair one by one."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        default=None, description="A rerank model, or an embedder (cosine); default as for /v1/rerank"
    )
    text_1: Texts | None = Field(default=None, description="The query, or queries")
    text_2: Texts | None = Field(default=None, description="The document, or documents")
    queries: Texts | None = Field(default=None, description="The same as text_1")
    documents: Texts | None = Field(default=None, description="The same as text_2")
    user: str | None = Field(default=None, max_length=256, description="Accepted and ignored")

    _check = field_validator("text_1", "text_2", "queries", "documents", mode="before")(_not_empty)

    @model_validator(mode="after")
    def _a_pair(self) -> ScoreRequest:
        first, second = self.names
        if (self.text_1 is None) == (self.queries is None):
            raise PydanticCustomError(
                "one_input", "give exactly one of 'text_1' or 'queries'", {"field": "text_1"}
            )
        if (self.text_2 is None) == (self.documents is None):
            raise PydanticCustomError(
                "one_input", "give exactly one of 'text_2' or 'documents'", {"field": "text_2"}
            )
        left, right = self._lists()
        if len(left) != 1 and len(left) != len(right):
            raise PydanticCustomError(
                "not_a_pair",
                "{first} has {n} texts and {second} {m}: lists pair one by one, so their lengths must "
                "match (or give one {first} for many {second})",
                {"field": second, "first": first, "second": second, "n": len(left), "m": len(right)},
            )
        return self

    @property
    def names(self) -> tuple[str, str]:
        return ("queries" if self.queries is not None else "text_1"), (
            "documents" if self.documents is not None else "text_2"
        )

    def _lists(self) -> tuple[list[str], list[str]]:
        left = self.text_1 if self.text_1 is not None else self.queries
        right = self.text_2 if self.text_2 is not None else self.documents
        return ([left] if isinstance(left, str) else list(left or [])), (
            [right] if isinstance(right, str) else list(right or [])
        )

    @property
    def pairs(self) -> list[tuple[str, str]]:
        left, right = self._lists()
        if len(left) == 1:
            return [(left[0], d) for d in right]
        return list(zip(left, right, strict=True))

    def field_names(self) -> FieldNames:
        first, second = self.names
        left, _ = self._lists()
        indexed = {
            QUERIES: f"{first}[0]" if len(left) == 1 else f"{first}[{{i}}]",
            DOCUMENTS: f"{second}[{{i}}]",
        }
        if isinstance(self.text_1 if self.text_1 is not None else self.queries, str):
            indexed[QUERIES] = first
        if isinstance(self.text_2 if self.text_2 is not None else self.documents, str):
            indexed[DOCUMENTS] = second
        return FieldNames(indexed, {QUERIES: first, DOCUMENTS: second})


ScoreBody = Annotated[
    ScoreRequest,
    json_body(ScoreRequest, exactly_one_of("text_1", "queries")),
]


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str = Field(description="The model that scored")
    scored_by: str = Field(description="`cosine`: the embedder's vectors (no reranker served)")
    data: list[ScoreData] = Field(description="One score per pair, in the pairs' order")
    usage: ScoreUsage
