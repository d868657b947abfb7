"""POST /v1/classify (JSON: text or base64 images) and POST /v1/classify/image (multipart upload).

Images travel base64 in JSON on the shared path, and as a file on the
sibling path: one path cannot take both without guessing from the
Content-Type, and separate paths document (and validate) each form clearly.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.fields import FieldNames
from service.api.http.guards import json_post, require_multipart
from service.api.http.meta import request_meta
from service.api.rest.envelope import envelope
from service.api.rest.schemas.classify import (
    MAX_TOP_K,
    ClassificationOut,
    ClassifyBody,
    ClassifyResponse,
    ImageUpload,
)
from service.errors import InvalidInputError
from service.inference import AttentionQuery, image_bytes


class ClassifyController(Controller):
    path = "/v1/classify"
    tags = ("classification",)

    @json_post("Classify texts or images", responses=INFERENCE_ERRORS)
    async def classify(
        self, services: Services, request: HttpRequest, data: ClassifyBody
    ) -> ClassifyResponse:
        """Text (SST-2 sentiment by default) or base64 PNG/JPEG images (Fashion-MNIST by default).

        A named model must serve the input's kind: an image for a text model is
        a 422 naming ``model``.
        """
        core, cache = services.inference, cache_control(request, data.cache)
        with data.field_names() as names:
            meta = data.scheduled(request_meta(request))
            if data.is_image:
                images = [
                    image_bytes(names.field("inputs", i) or "image", value, core.limits.max_image_bytes)
                    for i, value in enumerate(data.inputs)
                ]
                work = core.classify_images(
                    meta, images, data.top_k, data.model, cache, data.attention_query()
                )
            else:
                work = core.classify_texts(
                    meta, data.inputs, data.top_k, data.model, cache, data.attention_query(), data.truncation
                )
            outcome = await unless_disconnected(request, work)
        return ClassifyResponse(
            **envelope(outcome), results=[ClassificationOut.of(c) for c in outcome.results]
        )

    @post(
        "/image",
        status_code=200,
        before_request=require_multipart,
        responses=INFERENCE_ERRORS,
        summary="Classify one uploaded image (multipart)",
    )
    async def classify_upload(
        self,
        services: Services,
        request: HttpRequest,
        data: Annotated[ImageUpload, Body(media_type=RequestEncodingType.MULTI_PART)],
    ) -> ClassifyResponse:
        """Form fields: ``file`` (PNG/JPEG), optional ``top_k`` (1..100) and ``model``; optional
        ``return_attention``, ``attention_layer``, ``attention_head`` as in the JSON route."""
        if not 1 <= data.top_k <= MAX_TOP_K:
            raise InvalidInputError(f"must be in 1..{MAX_TOP_K}", "top_k", "out_of_range")
        for name in ("attention_layer", "attention_head"):
            if getattr(data, name) is not None and not data.return_attention:
                raise InvalidInputError(
                    f"{name} needs return_attention: true", name, "needs_return_attention"
                )
        if data.attention_head is not None and data.attention_head < 0:
            raise InvalidInputError("must be at least 0", "attention_head", "out_of_range")
        attention = (
            AttentionQuery(data.attention_layer, data.attention_head) if data.return_attention else None
        )
        content = await data.file.read()
        meta = request_meta(request)
        work = services.inference.classify_images(
            meta, [content], data.top_k, data.model or None, cache_control(request), attention
        )
        with FieldNames({}, {"inputs": "file"}):
            outcome = await unless_disconnected(request, work)
        return ClassifyResponse(
            **envelope(outcome), results=[ClassificationOut.of(c) for c in outcome.results]
        )
