"""A response leaves the server in one write, so a replica killed mid-answer never sends half of one.

uvicorn writes a response's headers when the app starts it and the body in a second write; a process
killed between the two left HAProxy holding forwarded headers it could not retry, and a client of
tests/test_replicas.py saw RemoteProtocolError for one request in 360 (CI, 2026-11-28). The server here
is the real uvicorn with the service's own config (service/http_server.py) on a loopback port, both
HTTP/1.1 protocols, on asyncio's loop; a spy on each connection's socket transport records what reaches the socket. The
plain uvicorn protocol is checked the same way and writes the headers alone: the case the test guards.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from litestar import Litestar, get
from litestar.response import Stream
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.http_server import CoalescedWrites, uvicorn_config
from service.settings import Settings

BODY = {"label": "positive", "score": 0.98}


@get("/whole", sync_to_thread=False)
def whole() -> dict[str, Any]:
    return BODY


@get("/stream")
async def stream() -> Stream:
    async def events() -> AsyncIterator[bytes]:
        for n in range(3):
            yield b"data: %d\n\n" % n
            await asyncio.sleep(0.01)  # each event in its own turn of the loop, as a generator's are

    return Stream(events(), media_type="text/event-stream")


class Server:
    """uvicorn in a thread on a free loopback port; ``spy`` records the socket writes of new connections."""

    def __init__(self, http: str) -> None:
        app = Litestar([whole, stream])
        # asyncio's loop (the service runs uvloop where it imports): uvloop's transports take no spy, and
        # the protocol classes, where the writes are joined, are the same on either loop.
        config = uvicorn_config(
            app, Settings(), host="127.0.0.1", port=0, log_level="warning", http=http, loop="asyncio"
        )
        if http == "plain":
            config.http = HttpToolsProtocol  # uvicorn's own, without the service's mixins
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def request(self, path: str) -> tuple[bytes, list[bytes]]:
        """GET ``path`` on a new connection: (the bytes received, the writes that reached the socket)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            deadline = time.monotonic() + 10
            while not self.server.server_state.connections:
                assert time.monotonic() < deadline, "the server never saw the connection"
                time.sleep(0.005)
            (protocol,) = self.server.server_state.connections
            transport = protocol.transport
            socket_transport = transport.inner if isinstance(transport, CoalescedWrites) else transport
            writes: list[bytes] = []
            real_write = socket_transport.write

            def spy(data: bytes) -> None:
                writes.append(bytes(data))
                real_write(data)

            socket_transport.write = spy  # the real write still happens; the spy only records it
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n".encode())
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        while self.server.server_state.connections:  # closed on the server's side too: writes are final
            time.sleep(0.005)
        return received, writes


@pytest.fixture(params=["httptools", "h11"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with Server(request.param) as running:
        yield running


def test_a_complete_response_reaches_the_socket_in_one_write(server: Server) -> None:
    received, writes = server.request("/whole")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b'{"label":"positive","score":0.98}')
    assert writes == [received], f"{len(writes)} writes: {writes}"


def test_a_stream_sends_its_headers_at_once_and_every_event_whole(server: Server) -> None:
    """Nothing is held past a turn of the loop: a stream's headers leave before its first event is made
    (a client knows its request was taken before a prefill ends), each event in one write."""
    received, writes = server.request("/stream")
    assert b"".join(writes) == received
    head, _, _ = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert writes[0] == head + b"\r\n\r\n"
    for n in range(3):
        assert sum(b"data: %d\n\n" % n in w for w in writes) == 1, f"event {n} split: {writes}"


def test_uvicorns_own_protocol_writes_the_headers_alone() -> None:
    """The case guarded against: without the service's protocol, a kill between two writes cuts an answer."""
    with Server("plain") as plain:
        received, writes = plain.request("/whole")
    assert b"".join(writes) == received
    assert len(writes) == 2 and writes[0].endswith(b"\r\n\r\n"), writes


def test_close_sends_what_is_held_and_abort_drops_it() -> None:
    async def main() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        results = []
        for end in ("close", "abort"):
            ours, theirs = socket.socketpair()
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
            coalesced = CoalescedWrites(transport, loop)  # type: ignore[arg-type]
            coalesced.write(b"held ")
            coalesced.write(b"until the end of the turn")
            assert coalesced.get_write_buffer_size() == len(b"held until the end of the turn")
            getattr(coalesced, end)()
            await asyncio.sleep(0.05)
            theirs.settimeout(5)
            received = b""
            try:
                while chunk := theirs.recv(1024):
                    received += chunk
            except ConnectionResetError:
                pass
            theirs.close()
            results.append(received)
        return results[0], results[1]

    closed, aborted = asyncio.run(main())
    assert closed == b"held until the end of the turn"
    assert aborted == b""
