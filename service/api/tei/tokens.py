"""The token routes: TEI's ``POST /tokenize`` and ``/decode``, and vLLM's ``POST /tokenize`` and ``/detokenize``.

TEI and vLLM both serve ``/tokenize``; their bodies tell them apart: TEI's has ``inputs`` and answers
``[[{id, text, special, start, stop}]]``, vLLM's has ``prompt`` (or chat ``messages``, rendered with the
model's chat template first, as vLLM does) and answers ``{count, max_model_len, tokens, token_strs}``.
Without ``model`` TEI's shape tokenizes with the default embedder's tokenizer and vLLM's with the default
generator's. Errors are TEI's on every token route.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Controller
from pydantic import BaseModel, ConfigDict, Field

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, json_body
from service.api.http.deps import HttpRequest, Services
from service.api.http.fields import FieldNames, one_or_many
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.tei.errors import TEI_ERRORS, TEI_EXCEPTION_HANDLERS
from service.api.tei.schemas import DecodeBody, TokenizeRequest
from service.api.tei.tasks import parsed_body
from service.errors import InvalidInputError
from service.metadata import RequestMeta

EMBEDDING = "feature-extraction"
GENERATION = "text-generation"


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str


class VllmTokenizeRequest(NoBooleanNumbers):
    """vLLM's ``POST /tokenize``: a ``prompt``, or chat ``messages``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=256)
    add_special_tokens: bool | None = Field(
        default=None, description="Default: true for a prompt, false for messages (the template adds them)"
    )
    add_generation_prompt: bool = True
    continue_final_message: Literal[False] = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class VllmDetokenizeRequest(NoBooleanNumbers):
    """vLLM's ``POST /detokenize``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    tokens: list[int] = Field(min_length=1)


DetokenizeBody = Annotated[VllmDetokenizeRequest, json_body(VllmDetokenizeRequest)]


class TokenController(Controller):
    path = "/"
    tags = ("tei",)
    exception_handlers = TEI_EXCEPTION_HANDLERS

    @json_post("Tokenize (TEI, vLLM)", "/tokenize", responses=TEI_ERRORS)
    async def tokenize(self, services: Services, data: dict[str, Any], request: HttpRequest) -> Any:
        """TEI's body (``inputs``): each text's tokens with their offsets, without truncation. vLLM's
        (``prompt`` or ``messages``): the ids, their count and the model's window."""
        meta = request_meta(request)
        if "prompt" in data or "messages" in data:
            return await _vllm_tokenize(services, parsed_body(VllmTokenizeRequest, data), meta)
        tei: TokenizeRequest = parsed_body(TokenizeRequest, data)
        with tei.field_names():
            _, rows = await services.inference.tokenize(
                meta, tei.texts, tei.model, None if tei.model else EMBEDDING, tei.add_special_tokens
            )
        return [
            [
                {"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.stop}
                for t in row
            ]
            for row in rows
        ]

    @json_post("Decode token ids (TEI)", "/decode", responses=TEI_ERRORS)
    async def decode(self, services: Services, data: DecodeBody, request: HttpRequest) -> list[str]:
        """Each row of ids as text (a single row answers a one-item list, as TEI)."""
        meta = request_meta(request)
        with data.field_names():
            _, texts = await services.inference.detokenize(
                meta, data.rows, data.model, None if data.model else EMBEDDING, data.skip_special_tokens
            )
        return texts

    @json_post("Detokenize (vLLM)", "/detokenize", responses=TEI_ERRORS)
    async def detokenize(
        self, services: Services, data: DetokenizeBody, request: HttpRequest
    ) -> dict[str, str]:
        """vLLM's: the ids as text, ``{"prompt": ...}`` (special tokens kept, as vLLM decodes)."""
        meta = request_meta(request)
        with FieldNames({}, {"ids": "tokens"}):
            _, texts = await services.inference.detokenize(
                meta, [data.tokens], data.model, None if data.model else GENERATION, skip_special_tokens=False
            )
        return {"prompt": texts[0]}


async def _vllm_tokenize(services: Services, data: VllmTokenizeRequest, meta: RequestMeta) -> dict[str, Any]:
    core, task = services.inference, None if data.model else GENERATION
    if (data.prompt is None) == (data.messages is None):
        raise InvalidInputError("give exactly one of 'prompt' or 'messages'", "prompt", "one_input")
    if data.messages is not None:
        served = await core.served(meta, data.model, task)
        prompt = await core.chat_prompt(
            meta,
            [m.model_dump() for m in data.messages],
            served.ref,
            data.add_generation_prompt,
            data.chat_template_kwargs,
        )
        special = bool(data.add_special_tokens)
    else:
        prompt, special = str(data.prompt), data.add_special_tokens is not False
    with one_or_many("prompt", "prompt", True):
        served, rows = await core.tokenize(meta, [prompt], data.model, task, special)
    tokens = rows[0]
    return {
        "count": len(tokens),
        "max_model_len": served.manifest.max_sequence_length,
        "tokens": [t.id for t in tokens],
        "token_strs": [t.text for t in tokens] if data.return_token_strs else None,
    }
