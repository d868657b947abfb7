"""Errors on TEI's routes, in TEI's shape: ``{"error": "message", "error_type": "Validation"}``.

Nothing is classified here: the core says what each error is (``service/errors.py``), and this renders it
with TEI's ``error_type`` and status (``router/src/http/server.rs``): a field that fails validation is
``Validation`` (422), an empty list ``Empty`` (400), a full queue ``Overloaded`` (429), a service not
ready ``Unhealthy`` (503), a failure of ours ``Backend`` (500); every other status (401, 404, 413, 504)
is kept, ``Validation``. The message names the field first, as this service's other doors do.
"""

from __future__ import annotations

from typing import Any, Literal

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap
from pydantic import BaseModel

from service.api.http.errors import error_responses, handlers
from service.errors import Problem

# The paths whose errors are TEI-shaped, also when a middleware answers (auth, overload).
TEI_PATHS = ("/rerank", "/embed", "/predict", "/similarity", "/tokenize", "/decode", "/detokenize", "/info")

ErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TeiErrorBody(BaseModel):
    error: str
    error_type: ErrorType


def is_tei_path(path: str) -> bool:
    """TEI's routes, and Hugging Face's task format under ``/models/`` (``api/tei/tasks.py``)."""
    return path in TEI_PATHS or path.startswith("/models/")


def tei_error(problem: Problem) -> tuple[int, ErrorType]:
    """TEI's status and ``error_type`` for a problem."""
    status = problem.status
    if status == 503:
        return 503, "Unhealthy"
    if status == 429:
        return 429, "Overloaded"
    if status >= 500 and status != 504:
        return status, "Backend"
    if problem.kind == "validation_error":
        if any(e.type == "too_short" for e in problem.errors):  # an empty list: TEI's "Empty"
            return 400, "Empty"
        if any(e.type == "unused_model_kwargs" for e in problem.errors):  # TGI's answer, read by its clients
            return 400, "Validation"
        return 422, "Validation"
    return status, "Validation"


def tei_error_body(problem: Problem) -> dict[str, Any]:
    return TeiErrorBody(error=problem.headline, error_type=tei_error(problem)[1]).model_dump()


def tei_response(request: Request[Any, Any, Any], problem: Problem) -> Response[dict[str, Any]]:
    return Response(
        tei_error_body(problem), status_code=tei_error(problem)[0], headers=problem.response_headers() or None
    )


TEI_EXCEPTION_HANDLERS: ExceptionHandlersMap = handlers(tei_response)

TEI_ERRORS: dict[int, ResponseSpec] = error_responses(
    400, 401, 404, 408, 413, 415, 422, 429, 500, 503, 504, body=TeiErrorBody
)
