"""Body checks, run as ``before_request`` hooks: the content type (before Litestar reads the body, so a wrong
type is a 415, not a parse error), then the body itself, decoded once here and cached for the handler.

Hooks rather than Litestar guards: a guard is called with a fresh ``copy()`` of the route handler on every
request (~70 µs of event-loop time); a ``before_request`` hook runs at the same point, before the
handler's arguments are parsed, for the price of a call.

Decoding in the guard puts every way a body can fail to parse in one place, as a 400 naming what is wrong.
Litestar turns msgspec's own decode errors into a 400, but lets others through as 500s: invalid UTF-8
inside a JSON string (``UnicodeDecodeError``), nesting deeper than the decoder's recursion limit
(``RecursionError``), a multipart text field that is not valid in its charset, or a charset nobody knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litestar import Request, post
from litestar.exceptions import SerializationException
from litestar.openapi.datastructures import ResponseSpec

from service.api.http.client_json import malformed
from service.errors import MalformedBodyError, UnsupportedMediaTypeError


def _media_type(request: Request[Any, Any, Any]) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def require_json(request: Request[Any, Any, Any]) -> None:
    """application/json, or any application/*+json, and a body that decodes as JSON (or none at all)."""
    media = _media_type(request)
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaTypeError(media, "application/json")
    await read_json(request)


async def read_json(request: Request[Any, Any, Any]) -> None:
    """A body that decodes as JSON (or none at all), whatever its Content-Type says.

    For Triton's generate extension, whose own examples send JSON with curl's default form type.
    """
    try:
        await request.json()  # cached on the connection: the handler's `data` reuses it
    except SerializationException as exc:  # msgspec's "JSON is malformed: ..."
        raise malformed(ValueError(str(exc.detail))) from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise malformed(exc) from exc


async def require_multipart(request: Request[Any, Any, Any]) -> None:
    """multipart/form-data with a boundary, and a body that parses as such (cached for the handler)."""
    media = _media_type(request)
    if media != "multipart/form-data":
        raise UnsupportedMediaTypeError(media, "multipart/form-data")
    if not request.content_type[1].get("boundary"):
        raise MalformedBodyError(
            "multipart/form-data needs a boundary parameter", "bad_request", field="Content-Type"
        )
    try:
        await request.form()  # a broken structure is Litestar's own 400 ("Invalid multipart/form-data")
    except UnicodeDecodeError as exc:
        raise MalformedBodyError(
            f"Invalid multipart/form-data: a text field is not valid {exc.encoding} ({exc.reason})"
        ) from exc
    except LookupError as exc:  # a part names a charset Python does not know
        raise MalformedBodyError(f"Invalid multipart/form-data: {exc}") from exc


def json_post(
    summary: str, *path: str | list[str], responses: Mapping[int, ResponseSpec], **kwargs: Any
) -> Any:
    """A POST route with a JSON body (checked by ``require_json``) that answers 200: every inference route."""
    return post(
        *path,
        status_code=200,
        before_request=require_json,
        responses=dict(responses),
        summary=summary,
        **kwargs,
    )
