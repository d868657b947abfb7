"""TLS at its edges: a connection that never finishes its handshake is dropped after
TLS_HANDSHAKE_TIMEOUT_S (the header deadline only starts after the handshake), and an idle TLS keep-alive
connection does not hold a SIGTERM for SHUTDOWN_TIMEOUT_S. A real ``python -m service`` over HTTPS, with
certificates this test makes (``test_tls``'s helpers); raw sockets for the clients that misbehave."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as tgrpc
from test_tls import _certificate, _key, _write

from harness.ports import free_port
from harness.service_process import ServiceProcess

HANDSHAKE_S = 2.0  # small here, so that the test's generous waits are long enough


class TlsProcess(ServiceProcess):
    """``python -m service`` over HTTPS: readiness is polled over TLS too."""

    def __init__(self, env: dict[str, str], ca: Path, log_path: Path) -> None:
        super().__init__(env, log_path=log_path, stop_grace_s=0)
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = ssl.create_default_context(cafile=str(ca))
        self.ca = ca

    def get_status(self, path: str) -> int | None:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=2, context=self.context)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, server_key = _key(), _key()
    ca = _certificate("test CA", ca_key, None)
    paths = {}
    paths["ca"], _ = _write(folder, "ca", ca, ca_key)
    paths["cert"], paths["key"] = _write(
        folder, "server", _certificate("127.0.0.1", server_key, (ca.subject, ca_key)), server_key
    )
    return paths


def _env(tiny_models: Path, pki: dict[str, Path], **settings: str) -> dict[str, str]:
    return {
        "MODEL_REPOSITORY": str(tiny_models),
        "SERVED_MODELS": "bert-classifier",
        "TLS_CERT_FILE": str(pki["cert"]),
        "TLS_KEY_FILE": str(pki["key"]),
        "CACHE_ENABLED": "false",
        **settings,
    }


@pytest.fixture(scope="module")
def server(
    tiny_models: Path, pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsProcess]:
    grpc_port = free_port()
    env = _env(
        tiny_models,
        pki,
        TLS_HANDSHAKE_TIMEOUT_S=str(HANDSHAKE_S),
        HEADER_READ_TIMEOUT_S="600",
        GRPC_PORT=str(grpc_port),
    )
    with TlsProcess(env, pki["ca"], tmp_path_factory.mktemp("logs") / "service.log") as process:
        process.grpc_port = grpc_port  # type: ignore[attr-defined]
        yield process


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` (EOF or a reset) within ``within_s``; False if it is still open."""
    sock.settimeout(within_s)
    try:
        return sock.recv(4096) == b""  # EOF (anything else would be an answer to a handshake never sent)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# The first bytes of a TLS 1.2 ClientHello record, cut short: a handshake begun and never finished.
PARTIAL_HELLO = bytes.fromhex("16030100c8010000c40303") + b"\x00" * 16


def test_connections_that_never_finish_their_handshake_are_dropped(server: TlsProcess) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    partial = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    for sock in partial:
        sock.sendall(PARTIAL_HELLO)
    try:
        # generous: ten times the bound; the header deadline (600 s) plays no part
        assert all(_closed_by_server(sock, HANDSHAKE_S * 10) for sock in silent + partial)
        # and the server still serves a client that does finish its handshake
        answer = httpx.post(
            f"{server.url}/v1/classify", json={"text": "a fine film"}, verify=server.context, timeout=60
        )
        assert answer.status_code == 200, answer.text
    finally:
        for sock in silent + partial:
            sock.close()


def test_the_grpc_door_drops_unfinished_handshakes_too(server: TlsProcess) -> None:
    """gRPC bounds its handshakes itself (grpc.server_handshake_timeout_ms, set to TLS_HANDSHAKE_TIMEOUT_S
    here; without it too these were dropped within the wait below): the twin of the HTTP door's case."""
    port = server.grpc_port  # type: ignore[attr-defined]
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    partial = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    for sock in partial:
        sock.sendall(PARTIAL_HELLO)
    try:
        assert all(_closed_by_server(sock, HANDSHAKE_S * 10) for sock in silent + partial)
        secure = tgrpc.InferenceServerClient(f"127.0.0.1:{port}", ssl=True, root_certificates=str(server.ca))
        assert secure.is_server_live()
        secure.close()
    finally:
        for sock in silent + partial:
            sock.close()


def test_a_handshake_that_finishes_is_not_cut_by_the_bound(server: TlsProcess) -> None:
    """The bound is on the handshake only: a connection that completed it and then idles longer than the
    bound stays open (its own deadline is HEADER_READ_TIMEOUT_S, 600 s here)."""
    raw = socket.create_connection(("127.0.0.1", server.port))
    with server.context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert not _closed_by_server(tls, HANDSHAKE_S * 2)
        tls.settimeout(30)
        tls.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert tls.recv(4096).startswith(b"HTTP/1.1 200")


def test_an_idle_tls_keep_alive_connection_does_not_hold_sigterm(
    tiny_models: Path, pki: dict[str, Path], tmp_path: Path
) -> None:
    env = _env(tiny_models, pki, SHUTDOWN_TIMEOUT_S="60")
    process = TlsProcess(env, pki["ca"], tmp_path / "service.log")
    with process:
        assert process.proc is not None
        client = httpx.Client(verify=process.context, timeout=30)  # keeps its connection alive
        answer = client.post(f"{process.url}/v1/classify", json={"text": "a fine film"})
        assert answer.status_code == 200 and answer.headers.get("connection") != "close"
        try:
            process.proc.terminate()  # SIGTERM, with the client's connection idle and open
            began = time.monotonic()
            process.proc.wait(timeout=45)
            waited = time.monotonic() - began
            # well under SHUTDOWN_TIMEOUT_S (60 s): the idle connection was closed at once, not waited for
            assert waited < 20, (waited, process.log_tail())  # unbounded, it waited 30 s (TLS shutdown)
            assert process.proc.returncode == 0, process.log_tail()
        finally:
            client.close()
