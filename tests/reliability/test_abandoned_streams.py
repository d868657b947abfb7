"""A stream whose client leaves stops decoding, on every door, whenever the client leaves.

Each client sends a streaming request and resets the connection at once (SO_LINGER 0), before the
response can start: the moment a generator-side ``finally`` never sees. The tokens the engine
generated meanwhile (``tserve_generated_tokens_total``) must be a small part of what the streams
asked for, and each stream must be counted as dropped. Before the response owned its streams, the
REST and v2 doors generated 6,604 of at most 6,720 tokens for 120 such streams. (A client that leaves
mid-stream is tested in test_api.py and test_faults.py.)
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import LiveServer, metric

from service.settings import Settings

STREAMS = 12
NEW_TOKENS = 56  # the tiny GPT's window is 64

DOORS: dict[str, tuple[str, dict[str, Any]]] = {
    "rest": (
        "/v1/generate",
        {"prompt": "the", "max_new_tokens": NEW_TOKENS, "temperature": 0, "stream": True},
    ),
    "openai": (
        "/v1/completions",
        {"model": "gpt", "prompt": "the", "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True},
    ),
    "v2": (
        "/v2/models/gpt/generate_stream",
        {"text_input": "the", "max_tokens": NEW_TOKENS, "temperature": 0},
    ),
}


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_RUNNING_SEQUENCES=4)
    with LiveServer(settings) as server:
        yield server


def _send_and_reset(url: str, path: str, body: dict[str, Any]) -> None:
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    sock.close()


def _settled(url: str, name: str) -> float:
    """The metric once it has stopped moving (the engine finished or dropped every sequence)."""
    value = metric(url, name)
    for _ in range(50):
        time.sleep(0.2)
        now = metric(url, name)
        if now == value:
            return now
        value = now
    return value


@pytest.mark.parametrize("door", list(DOORS))
def test_a_stream_reset_before_its_first_byte_stops_decoding(api: LiveServer, door: str) -> None:
    path, body = DOORS[door]
    # the stream works when nobody leaves
    with httpx.stream("POST", f"{api.url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert sum(1 for line in response.iter_lines() if line.startswith("data:")) > 1

    tokens = _settled(api.url, "tserve_generated_tokens_total")
    dropped = metric(api.url, "tserve_requests_dropped_total")
    for _ in range(STREAMS):
        _send_and_reset(api.url, path, body)
    generated = _settled(api.url, "tserve_generated_tokens_total") - tokens
    print(f"{door}: {generated:.0f} tokens generated for {STREAMS} streams reset at once")
    assert generated <= STREAMS * NEW_TOKENS * 0.25, generated
    # every stream that had started decoding was cancelled, not finished
    assert metric(api.url, "tserve_requests_dropped_total") - dropped >= STREAMS / 2
