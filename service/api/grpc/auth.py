"""API keys on the gRPC door: the key table of both doors (``service/access/keys.py``), applied before any RPC runs.

An interceptor rather than a check inside each RPC, so that no RPC can be added without it: every
method, the ones this service leaves ``UNIMPLEMENTED`` included, answers ``UNAUTHENTICATED`` without a
valid key, except the health RPCs (``ServerLive``, ``ServerReady``) while AUTH_HEALTH is off. The key
travels in the call's metadata as on HTTP: ``authorization: Bearer KEY`` or ``x-api-key: KEY``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from service.access.keys import ApiKeys, presented_key

UNAUTHENTICATED = "a valid API key is required: metadata authorization: Bearer KEY, or x-api-key: KEY"


def metadata_of(invocation_metadata: Any) -> dict[bytes, bytes]:
    """A call's metadata as the HTTP key check reads headers: lower-case byte names to byte values."""
    return {k.lower().encode(): v.encode() if isinstance(v, str) else v for k, v in invocation_metadata or ()}


def _denial(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED with ``message``."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(  # type: ignore[no-any-return]
        deny,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or self.keys.rpc_is_open(details.method):
            return handler
        presented = presented_key(metadata_of(details.invocation_metadata))
        if presented and self.keys.accepts(presented):
            return handler
        return _denial(handler, UNAUTHENTICATED if not presented else "the API key is not valid")
