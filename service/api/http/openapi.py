"""OpenAPI details Litestar's route decorators cannot say: a response with more than one media type, and a
body the handler reads itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, RequestBody, Schema


def also_answers(media_types: Mapping[str, Mapping[str, Any]], status: int = 200) -> type[Operation]:
    """An ``operation_class`` whose ``status`` response documents ``media_types`` beside the handler's own.

    ``ResponseSpec`` and ``media_type=`` document one media type per status; use this where content
    negotiation or a request field picks another (``text/event-stream``, OpenMetrics). The values are
    JSON Schemas, as plain dicts (Litestar serialises nested dicts as they are).
    """

    @dataclass
    class AlsoAnswers(Operation):
        def __post_init__(self) -> None:
            response = (self.responses or {}).get(str(status))
            if isinstance(response, OpenAPIResponse):
                extra = {
                    name: OpenAPIMediaType(schema=cast(Schema, dict(schema)))
                    for name, schema in media_types.items()
                }
                response.content = {**(response.content or {}), **extra}

    return AlsoAnswers


def request_body(schema: dict[str, Any], description: str) -> type[Operation]:
    """An ``operation_class`` documenting a JSON body the handler reads itself (binary tensors that follow
    the JSON, an optional body)."""

    @dataclass
    class WithBody(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                content={"application/json": OpenAPIMediaType(schema=cast(Schema, schema))},
                description=description,
                required=True,
            )

    return WithBody
