"""Limits and awkward input: every case gets a 2xx, or a 4xx that names the field and says why.

Body size (413), per-field lengths, items per request, image bytes and pixels
(a decompression bomb is refused from its header, never decoded), the cap on
items x max_new_tokens, and text edge cases on every text endpoint.
"""

from __future__ import annotations

import base64
import io
import json
import resource
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from servers import LiveServer

from service.settings import Settings

LIMITS = {
    "MAX_TEXT_CHARS": 12000,
    "MAX_CONTEXT_CHARS": 12000,
    "MAX_ITEMS": 4,
    "MAX_NEW_TOKENS": 32,
    "MAX_TOTAL_NEW_TOKENS": 64,
    "MAX_BODY_BYTES": 64 * 1024,
    "MAX_IMAGE_BYTES": 16 * 1024,
    "MAX_IMAGE_PIXELS": 512 * 512,
    "MAX_REQUEST_PIXELS": 3 * 256 * 256,
    "MAX_CONTEXT_TOKENS": 600,
}


@pytest.fixture(scope="module")
def client(tiny_models: Path) -> Iterator[httpx.Client]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, **LIMITS)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def refused(r: httpx.Response, status: int, field: str | None, reason: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"]
    if field is not None:
        assert error["field"] == field, error
    if reason is not None:
        assert reason in {e["type"] for e in error.get("errors") or []} | {error["type"]}, error
    return dict(error)


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, height), 128).save(out, format="PNG")
    return out.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height grey pixels, with a tiny (truncated) zlib stream of zeros.

    Decoded, it would need width x height bytes; the service must refuse it from the header alone.
    """

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 8, 9)  # the first 8 rows; a bomb needs no more to look real
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


# --- what one request may cost ------------------------------------------------------------------


def test_a_request_s_pixels_are_bounded_together(client: httpx.Client) -> None:
    """MAX_REQUEST_PIXELS counts every image of the request from its header, before any is decoded, and
    names the image that passes it."""
    square = base64.b64encode(png(256, 256)).decode()
    assert client.post("/v1/classify", json={"images": [square] * 3}).status_code == 200
    error = refused(client.post("/v1/classify", json={"images": [square] * 4}), 422, "images[3]", "too_large")
    assert "MAX_REQUEST_PIXELS" in error["message"]


def test_a_qa_request_s_window_tokens_are_bounded_together(client: httpx.Client) -> None:
    """MAX_CONTEXT_TOKENS counts the tokens of every window of every pair (usage.input_tokens), and names
    the pair that passes it."""
    context = "Marie lives in Paris with her cat and a small dog. " * 6
    one = client.post(
        "/v1/extract", json={"task": "qa", "question": "Who lives in Paris?", "context": context}
    )
    assert one.status_code == 200, one.text
    tokens = one.json()["usage"]["input_tokens"]
    fits = LIMITS["MAX_CONTEXT_TOKENS"] // tokens
    assert 1 <= fits < LIMITS["MAX_ITEMS"], tokens
    items = [{"question": "Who lives in Paris?", "context": context}] * (fits + 1)
    r = client.post("/v1/extract", json={"task": "qa", "items": items})
    error = refused(r, 422, f"items[{fits}].context", "too_long")
    assert "MAX_CONTEXT_TOKENS" in error["message"]
    assert client.post("/v1/extract", json={"task": "qa", "items": items[:fits]}).status_code == 200


# --- sizes and counts ------------------------------------------------------------------------------


def test_body_over_the_limit_is_413(client: httpx.Client) -> None:
    r = client.post("/v1/classify", json={"text": "a" * (LIMITS["MAX_BODY_BYTES"] + 10)})
    refused(r, 413, None, "payload_too_large")


def test_field_lengths(client: httpx.Client) -> None:
    over = "a" * (LIMITS["MAX_TEXT_CHARS"] + 1)
    refused(client.post("/v1/classify", json={"text": over}), 422, "text", "too_long")
    refused(client.post("/v1/generate", json={"prompts": ["ok", over]}), 422, "prompts[1]", "too_long")
    qa = {"task": "qa", "question": "why?", "context": "b" * (LIMITS["MAX_CONTEXT_CHARS"] + 1)}
    refused(client.post("/v1/extract", json=qa), 422, "context", "too_long")
    refused(client.post("/v1/generate", json={"prompt": "x", "stop": ["s" * 65]}), 422, "stop[0]")


def test_items_per_request(client: httpx.Client) -> None:
    many = ["fine"] * (LIMITS["MAX_ITEMS"] + 1)
    refused(client.post("/v1/classify", json={"texts": many}), 422, "texts", "too_many_items")
    refused(client.post("/v1/translate", json={"texts": many}), 422, "texts", "too_many_items")
    images = [base64.b64encode(png(8, 8)).decode()] * (LIMITS["MAX_ITEMS"] + 1)
    refused(client.post("/v1/classify", json={"images": images}), 422, "images", "too_many_items")
    assert client.post("/v1/classify", json={"texts": many[:-1]}).status_code == 200


def test_new_tokens_times_items_is_capped(client: httpx.Client) -> None:
    # 3 prompts x 32 = 96 > 64
    over = {"prompts": ["a", "b", "c"], "max_new_tokens": 32, "temperature": 0}
    error = refused(client.post("/v1/generate", json=over), 422, "max_new_tokens", "over_budget")
    assert "MAX_TOTAL_NEW_TOKENS" in error["message"]
    # 2 texts x 4 beams x 16 = 128 > 64
    beams = {"texts": ["A dog.", "A cat."], "beam_size": 4, "max_new_tokens": 16}
    refused(client.post("/v1/translate", json=beams), 422, "max_new_tokens", "over_budget")
    assert client.post("/v1/generate", json={**over, "max_new_tokens": 20}).status_code == 200
    over_one = {"prompt": "a", "max_new_tokens": LIMITS["MAX_NEW_TOKENS"] + 1}
    refused(client.post("/v1/generate", json=over_one), 422, "max_new_tokens", "out_of_range")


def test_image_limits_and_a_decompression_bomb(client: httpx.Client) -> None:
    big = base64.b64encode(b"\x89PNG" + bytes(LIMITS["MAX_IMAGE_BYTES"] + 100)).decode()
    refused(client.post("/v1/classify", json={"image": big}), 422, "image", "too_large")
    wide = base64.b64encode(png(1024, 300)).decode()  # small file, too many pixels
    error = refused(client.post("/v1/classify", json={"image": wide}), 422, "image", "undecodable_image")
    assert "pixels" in error["message"]

    bomb = png_bomb(60_000, 60_000)  # 3.6 GB of pixels behind a few hundred bytes
    assert len(bomb) < 4096
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; the server runs in this process
    for encoded in (base64.b64encode(bomb).decode(),):
        error = refused(client.post("/v1/classify", json={"image": encoded}), 422, "image")
        assert "pixels" in error["message"] and "limit" in error["message"]
    upload = client.post("/v1/classify/image", files={"file": ("bomb.png", bomb, "image/png")})
    refused(upload, 422, "file")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 1024  # nothing expanded

    assert client.post("/v1/classify", json={"image": base64.b64encode(png(300, 200)).decode()}).is_success


# --- text edge cases --------------------------------------------------------------------------------

EDGE_TEXTS = {
    "emoji": "😀🎉👍🏽 great movie 🍿",
    "right-to-left": "مرحبا بالعالم שלום עולם",
    "control characters": "\x00\x07bell\x1b[31mred\x1b[0m\ttab\x7f",
    "zero-width and combining": "e\u0301\u200b\u200d\ufeffcafe\u0301",
    "one 10,000-character word": "a" * 10_000,
    "only unknown tokens": "\u2603\u2604\u2605\u2606\u2607" * 4,
    "NUL only": "\x00" * 16,
    "mixed scripts": "Tokyo 東京 Москва Αθήνα",
}


def edge_requests(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/v1/classify", {"text": text}),
        ("/v1/translate", {"text": text, "max_new_tokens": 8}),
        ("/v1/generate", {"prompt": text, "max_new_tokens": 4, "temperature": 0}),
        ("/v1/extract", {"task": "entities", "text": text}),
        ("/v1/extract", {"task": "qa", "question": text[:200], "context": text}),
    ]


@pytest.mark.parametrize("case", sorted(EDGE_TEXTS))
def test_text_edge_cases_are_answered_cleanly(client: httpx.Client, case: str) -> None:
    text = EDGE_TEXTS[case]
    for path, body in edge_requests(text):
        r = client.post(path, json=body)
        if r.status_code == 200:
            result = r.json()["results"][0]
            if "start" in result and result.get("window") is not None:  # QA offsets index the input
                assert body["context"][result["start"] : result["end"]] == result["answer"]
            for entity in result.get("entities", []):
                assert text[entity["start"] : entity["end"]] == entity["text"]
        else:
            # Only a prompt longer than the tiny GPT's context may be refused, and it says why.
            assert (path, r.status_code) == ("/v1/generate", 422), (case, path, r.text)
            refused(r, 422, "prompt", "too_long")
    assert client.get("/health/ready").status_code == 200


@pytest.mark.parametrize(
    ("case", "text", "reason"),
    [("empty", "", "blank_text"), ("whitespace only", " \n\t\u3000 ", "blank_text")],
)
def test_blank_text_is_refused_everywhere(client: httpx.Client, case: str, text: str, reason: str) -> None:
    for path, body in edge_requests(text):
        r = client.post(path, json=body)
        field = next(k for k in ("text", "prompt", "question") if k in body)
        refused(r, 422, field, reason)


def test_invalid_surrogates_are_a_400_that_says_why(client: httpx.Client) -> None:
    raw = '{"text": "abc \\ud800 def"}'  # a lone surrogate: valid JSON syntax, not a valid string
    for path in ("/v1/classify", "/v1/translate", "/v1/generate"):
        body = raw.replace('"text"', '"prompt"') if path == "/v1/generate" else raw
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        error = refused(r, 400, None, "malformed_json")
        assert "surrogate" in error["message"]
    # Escaped as a proper pair, the same character class is fine.
    pair = json.dumps({"text": "abc \U0001f600 def"})
    assert client.post("/v1/classify", content=pair, headers={"content-type": "application/json"}).is_success


def test_requests_past_the_in_flight_cap_get_503_before_their_body_is_read(tiny_models: Path) -> None:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        CACHE_ENABLED=False,
        MAX_IN_FLIGHT_REQUESTS=2,
        MAX_QUEUE_DELAY_MS=1500,  # the admitted two wait in the queue, holding their places
        MAX_BATCH_SIZE=64,
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(6) as pool:
            posts = [pool.submit(c.post, "/v1/classify", json={"text": f"film {i}"}) for i in range(6)]
            ready = c.get("/health/ready")  # probes are answered whatever the load
            answers = [f.result() for f in posts]
        assert ready.status_code == 200
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 200, 503, 503, 503, 503]
        for a in answers:
            if a.status_code == 503:
                assert a.headers["retry-after"] == "1" and a.json()["error"]["type"] == "overloaded"
