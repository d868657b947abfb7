"""Slow clients hold no slot: a body that trickles in is not counted in flight, and the server closes it.

A thousand connections that each declare a body and send a byte every few seconds once took every
slot of MAX_IN_FLIGHT_REQUESTS, so that every good request answered 503 ``overloaded`` while the
readiness probe said 200. Here the cap is 4 and twelve such connections (and two whose headers never
end) are open while a good request is sent: it answers 200, and each slow connection gets a 408 and
is closed once its deadline (BODY_READ_TIMEOUT_S, HEADER_READ_TIMEOUT_S) has passed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from litestar import Litestar, get
from servers import LiveServer

from service.http_server import uvicorn_config
from service.settings import Settings

SLOW_BODIES = 12
CAP = 4


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        MAX_IN_FLIGHT_REQUESTS=CAP,
        BODY_READ_TIMEOUT_S=3,
        HEADER_READ_TIMEOUT_S=3,
        CACHE_ENABLED=False,
    )
    with LiveServer(settings) as server:
        yield server


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a 30 s socket timeout is a failure)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slow_bodies_and_headers_deny_no_one_and_are_closed_at_their_deadline(api: LiveServer) -> None:
    slow_bodies = []
    for _ in range(SLOW_BODIES):
        sock = _connect(api.url)
        sock.sendall(
            b"POST /v1/classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        slow_bodies.append(sock)
    slow_headers = []
    for _ in range(2):
        sock = _connect(api.url)
        sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: t\r\n")
        slow_headers.append(sock)
    time.sleep(0.5)  # every slow request has reached the app (or the parser) by now

    good = httpx.post(f"{api.url}/v1/classify", json={"text": "a fine film"}, timeout=30)
    assert good.status_code == 200, good.text
    assert api.app.state.lifecycle.in_flight == 0  # the slow ones were never admitted
    ready = httpx.get(f"{api.url}/health/ready", timeout=30)
    assert ready.status_code == 200

    for sock in slow_bodies:
        answer = _read_until_closed(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower()
        assert b'"request_timeout"' in answer and b"BODY_READ_TIMEOUT_S" in answer
    for sock in slow_headers:
        answer = _read_until_closed(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"HEADER_READ_TIMEOUT_S" in answer


def test_keep_alive_connection_gets_a_header_deadline_for_each_request(api: LiveServer) -> None:
    """After a complete answer the next request's headers have their own deadline: a client that answers
    one request and then trickles the next one's headers is closed too (with a 408); an idle keep-alive
    connection is closed without one."""
    sock = _connect(api.url)
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: t\r\n\r\n")
    first = b""
    while b'"live"' not in first and b"}" not in first:
        first += sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    sock.sendall(b"GET /health/live HTTP/1.1\r\n")
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]

    idle = _connect(api.url)
    assert _read_until_closed(idle) == b""  # closed quietly (by the keep-alive or the header deadline)
    idle.close()


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(api: LiveServer) -> None:
    """Content-Length past MAX_BODY_BYTES: 413 at once and the connection closed; nothing is buffered."""
    sock = _connect(api.url)
    limit = api.app.state.settings.max_body_bytes
    sock.sendall(
        b"POST /v1/classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {limit + 1}\r\n\r\n".encode()
    )
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"payload_too_large"' in answer


def test_a_chunked_body_is_refused_once_it_passes_the_limit(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, MAX_BODY_BYTES=4096, WARMUP=False)
    with LiveServer(settings) as server:

        def chunks() -> Iterator[bytes]:
            yield b'{"text": "'
            for _ in range(64):
                yield b"a" * 1024

        response = httpx.post(
            f"{server.url}/v1/classify",
            content=chunks(),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "payload_too_large"


def test_no_server_header(api: LiveServer) -> None:
    """The answer does not name the server (nor its version) to a client."""
    response = httpx.get(f"{api.url}/health/live", timeout=30)
    assert response.status_code == 200
    assert "server" not in response.headers


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_header_deadline_holds_for_both_of_uvicorn_s_protocols(http: str) -> None:
    """``--http h11`` (uvicorn's fallback without httptools) gets the same deadline as httptools."""

    @get("/x")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    config = uvicorn_config(
        Litestar([ok]), Settings(HEADER_READ_TIMEOUT_S=1), host="127.0.0.1", port=0, http=http
    )
    protocol = {"httptools": "HttpToolsWithDeadline", "h11": "H11WithDeadline"}[http]
    assert getattr(config.http, "__name__", "") == protocol
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        assert httpx.get(f"{url}/x", timeout=10).json() == {"ok": True}
        sock = _connect(url)
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n")
        answer = _read_until_closed(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"HEADER_READ_TIMEOUT_S" in answer
    finally:
        server.should_exit = True
        thread.join(timeout=10)
