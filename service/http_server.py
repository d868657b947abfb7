"""How uvicorn serves the app: the one place its settings are made, for ``python -m service`` and the tests.

uvicorn has no deadline for a request's headers: its keep-alive timer is cancelled by the first
byte of a new request, so a client that sends a header line every few seconds holds a connection
for ever (slowloris). ``HEADER_READ_TIMEOUT_S`` bounds the time from a connection's opening (or the
end of its previous response) to the end of its next request's headers; past it the server answers
408 and closes the connection. The same deadline is added to both of uvicorn's HTTP/1.1 protocols
(httptools, h11), whichever ``--http`` picks. The body has its own deadline, in the app's admission
middleware (``service.api.http.admission``), since uvicorn hands the body to the app as it comes.

A response goes out in one piece: uvicorn writes a response's status line and headers as soon as the
app starts it and the body in a second write, so a replica killed between the two (SIGKILL, the OOM
killer) leaves a load balancer holding headers it has already forwarded and cannot retry: the client
sees a cut response. ``CoalescedWrites`` holds what is written within one turn of the event loop and
sends it in one write at the end of that turn (or at close, first), so a complete response is either sent whole or not at all (an empty answer, which HAProxy retries on
another replica), and the server makes one ``send`` per response where it made two.

No ``Server`` header: it tells an attacker which server (and so which advisories) to try, and tells a
client nothing it needs.

With TLS, two more bounds. A connection's handshake happens before uvicorn's protocol sees it, so the
header deadline cannot bound it: ``TLS_HANDSHAKE_TIMEOUT_S`` is the listening socket's own
``ssl_handshake_timeout`` (asyncio's and uvloop's ``create_server``; uvicorn passes none, so its loop's
``create_server`` gets it here, ``ServerConfig.get_loop_factory``), past which the connection is dropped.
And on a drain, an idle TLS keep-alive connection is aborted rather than closed: a TLS close sends
close_notify and waits for the peer's, which an idle client never sends, so the shutdown would wait its
whole SHUTDOWN_TIMEOUT_S for it (``HeaderDeadline.shutdown``); nothing is lost, since nothing is unsent.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings

_TIMEOUT_BODY = b"the request's headers did not arrive within HEADER_READ_TIMEOUT_S"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class CoalescedWrites(asyncio.Transport):
    """A connection's transport whose writes within one turn of the event loop leave in one write.

    The first write is held and a flush is scheduled for the end of the turn; writes that follow in the
    same turn join it. ``close`` and ``write_eof`` send what is held first; ``abort`` drops it, as the
    transport's own abort drops its buffer. Everything else is the transport's own.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.inner = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._held.append(bytes(data))
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self.flush)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is held, in one write (dropped if the connection is already closing)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        held, self._held = self._held, []
        if held and not self.inner.is_closing():
            self.inner.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self.inner.close()

    def abort(self) -> None:
        self._held = []
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.inner.abort()

    def write_eof(self) -> None:
        self.flush()
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size() + sum(map(len, self._held))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()


class HeaderDeadline:
    """A mixin for uvicorn's HTTP protocols: 408 and close when a request's headers take too long.

    The deadline starts when the connection opens and again when a response completes (the next
    request's idle time counts, as the keep-alive timeout's does); it is met when the protocol starts
    a new request cycle, which both protocols do once the headers are complete. A connection on which
    no byte of a new request has arrived is closed without a word, as an idle keep-alive one is.
    """

    config: Any
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _header_timer: asyncio.TimerHandle | None = None
    _header_cycle: Any = None
    _header_started = False  # a byte of the next request has arrived

    def _arm_header_deadline(self) -> None:
        self._header_cycle = self.cycle  # the cycle the headers of the next request will replace
        self._header_started = False
        timeout_s = getattr(self.config, "header_read_timeout_s", 10.0)
        self._header_timer = self.loop.call_later(timeout_s, self._header_deadline_passed)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline_passed(self) -> None:
        self._header_timer = None
        idle = self.cycle is None or self.cycle.response_complete  # no request of its own is being answered
        if self.cycle is self._header_cycle and idle and not self.transport.is_closing():
            if self._header_started:  # a request began and never finished its headers: say why
                self.transport.write(_TIMEOUT_RESPONSE)
            self.transport.close()  # an idle connection is closed quietly, as the keep-alive timeout does

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        self._header_started = True
        super().data_received(data)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm_header_deadline()
        if not self.transport.is_closing():
            self._arm_header_deadline()

    def shutdown(self) -> None:
        """The server's drain: an idle TLS connection with nothing left to send is aborted at once (a TLS
        close would wait for the idle peer's close_notify); anything else as uvicorn does."""
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.transport.get_extra_info("ssl_object") is not None:
            flush = getattr(self.transport, "flush", None)
            if flush is not None:
                flush()  # what a response wrote this turn goes first
            if self.transport.get_write_buffer_size() == 0:
                self._disarm_header_deadline()
                self.transport.abort()
                return
        super().shutdown()  # type: ignore[misc]


class WholeResponses:
    """A mixin for uvicorn's HTTP protocols: the connection's writes go through ``CoalescedWrites``."""

    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalesced = CoalescedWrites(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(coalesced)  # type: ignore[misc]


class HttpToolsWithDeadline(HeaderDeadline, WholeResponses, HttpToolsProtocol):
    """uvicorn's httptools protocol (its choice when httptools is installed) with the header deadline,
    sending each response whole."""


class H11WithDeadline(HeaderDeadline, WholeResponses, H11Protocol):
    """uvicorn's h11 protocol with the header deadline, sending each response whole."""


def _protocol(http: str) -> type[asyncio.Protocol]:
    """The protocol class uvicorn's ``http`` setting names (``auto``: httptools when it imports), with the
    header deadline."""
    if http in ("auto", "httptools"):
        try:
            import httptools  # noqa: F401

            return HttpToolsWithDeadline
        except ImportError:
            if http == "httptools":
                raise
    return H11WithDeadline


class ServerConfig(uvicorn.Config):
    """uvicorn's ``Config`` plus the header deadline (a module-level class: worker processes unpickle it)."""

    def __init__(
        self, app: Any, header_read_timeout_s: float, tls_handshake_timeout_s: float = 10.0, **options: Any
    ) -> None:
        super().__init__(app, **options)
        self.header_read_timeout_s = header_read_timeout_s
        self.tls_handshake_timeout_s = tls_handshake_timeout_s

    def get_loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop] | None:
        """uvicorn's loop, whose ``create_server`` bounds a TLS handshake (TLS_HANDSHAKE_TIMEOUT_S)."""
        factory = super().get_loop_factory()
        if not self.is_ssl:
            return factory
        timeout_s = self.tls_handshake_timeout_s

        def bounded_loop() -> asyncio.AbstractEventLoop:
            loop = (factory or asyncio.new_event_loop)()
            create_server = loop.create_server

            @functools.wraps(create_server)
            async def create_tls_server(*args: Any, **kwargs: Any) -> asyncio.AbstractServer:
                if kwargs.get("ssl") is not None:
                    kwargs.setdefault("ssl_handshake_timeout", timeout_s)
                return await create_server(*args, **kwargs)

            loop.create_server = create_tls_server  # type: ignore[method-assign,assignment]
            return loop

        return bounded_loop


def uvicorn_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's ``Config`` for ``app`` (the app, or an import string with ``factory=True``) under
    ``settings``; ``options`` are passed on (host, port, workers, log level...)."""
    options.setdefault("host", settings.host)
    options.setdefault("port", settings.port)
    if settings.tls_cert_file is not None:  # HTTPS (TLS_*); with a client CA, mutual TLS
        options.setdefault("ssl_certfile", str(settings.tls_cert_file))
        options.setdefault("ssl_keyfile", str(settings.tls_key_file))
        if settings.tls_client_ca_file is not None:
            options.setdefault("ssl_ca_certs", str(settings.tls_client_ca_file))
            options.setdefault("ssl_cert_reqs", ssl.CERT_REQUIRED)
    return ServerConfig(
        app,
        settings.header_read_timeout_s,
        settings.tls_handshake_timeout_s,
        http=_protocol(options.pop("http", "auto")),
        server_header=False,
        **options,
    )
