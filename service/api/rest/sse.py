"""Server-Sent Events for a streamed generation: ``token`` events, then ``done`` (or ``error``).

Event data is JSON:
- ``event: token`` -> ``{"index", "token_id", "text"}``, one per generated token;
- ``event: done`` -> ``{"model", "model_version", "finish_reason", "text", "usage"}``, last;
- ``event: error`` -> the error body ``{"error": {"type", "message", ...}}``, if decoding fails mid-stream.

The response owns the sequence (``api/http/streaming.py``): whenever it ends, before its first byte
or mid-stream, the sequence is cancelled, so the engine stops decoding it at its next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from service.api.http.error_body import error_body
from service.api.http.streaming import GenerationEvents, sse_event
from service.api.rest.schemas.generate import DoneEventOut
from service.errors import problem_of
from service.inference import GenerationStreams, TokenOut

_encode = msgspec.json.Encoder().encode


async def _events(streams: GenerationStreams, request_id: str | None) -> AsyncIterator[bytes]:
    try:
        async for item in streams:
            if isinstance(item, TokenOut):
                event = item.event
                # ``TokenEventOut``'s fields, in its order (the schema OpenAPI documents), encoded directly
                data = {"index": event.index, "token_id": event.token_id, "text": event.text}
                yield sse_event(_encode(data), b"token")
                continue
            usage = streams.usage()
            done = DoneEventOut(
                model=streams.model,
                model_version=streams.model_version,
                finish_reason=item.generation.finish_reason,
                text=item.generation.text,
                usage={
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "total_tokens": usage.total_tokens,
                },
            )
            yield sse_event(done.model_dump_json().encode(), b"done")
    except Exception as exc:  # headers are sent: the failure can only be reported in-band
        body = error_body(problem_of(exc, "a generation stream"), request_id)
        yield sse_event(body.model_dump_json(exclude_none=True).encode(), b"error")


def generation_events(streams: GenerationStreams, request_id: str | None) -> GenerationEvents:
    return GenerationEvents(_events(streams, request_id), streams)
