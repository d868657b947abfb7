"""The response cache: the LRU and the keys on their own, then the service against a real redis-server.

The Redis here is private to each test that kills it (a `RedisServer` on a free
port), so stopping it never disturbs another test or the machine's own Redis.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import RedisServer
from servers import LiveServer, metric

from service.cache import MemoryCache, response_key
from service.cache.response_cache import CacheControl
from service.engine.manifest import MANIFEST, content_version, file_sha256
from service.settings import Settings

TEXT = {"text": "a gorgeous, witty film"}
TRANSLATE = {"text": "A man is riding a bicycle.", "max_new_tokens": 16}
GREEDY = {"prompt": "ROMEO:", "max_new_tokens": 12, "temperature": 0}
QA = {"task": "qa", "question": "Who won?", "context": "The Denver Broncos won Super Bowl 50."}


# --- the pieces ------------------------------------------------------------------------------


def test_memory_cache_is_an_lru_with_a_ttl() -> None:
    now = [0.0]
    cache = MemoryCache(max_entries=2, clock=lambda: now[0])

    async def scenario() -> None:
        await cache.set("a", b"1", ttl_s=10)
        await cache.set("b", b"2", ttl_s=10)
        assert await cache.get("a") == b"1"  # a is now the most recent
        await cache.set("c", b"3", ttl_s=10)  # evicts b, the least recently used
        assert await cache.get("b") is None
        assert await cache.get("a") == b"1" and await cache.get("c") == b"3"
        now[0] = 10.0
        assert await cache.get("a") is None  # expired
        assert len(cache) == 1

    asyncio.run(scenario())


def test_memory_cache_is_bounded_in_bytes_too() -> None:
    cache = MemoryCache(max_entries=100, max_bytes=10)

    async def scenario() -> None:
        await cache.set("a", b"1234", ttl_s=10)
        await cache.set("b", b"5678", ttl_s=10)
        await cache.set("c", b"90ab", ttl_s=10)  # 12 bytes > 10: the oldest goes
        assert await cache.get("a") is None and await cache.get("c") == b"90ab"
        assert cache.bytes == 8
        await cache.set("b", b"x", ttl_s=10)  # replacing an entry gives its bytes back
        assert cache.bytes == 5
        await cache.set("huge", b"z" * 11, ttl_s=10)  # larger than the whole cache: not stored
        assert await cache.get("huge") is None and len(cache) == 2

    asyncio.run(scenario())


def test_keys_cover_model_version_task_and_every_parameter() -> None:
    base = response_key("p", "m", "v1", "translation", {"texts": ["x"], "beam_size": 1})
    assert base == response_key("p", "m", "v1", "translation", {"beam_size": 1, "texts": ["x"]})
    others = [
        response_key("p", "m", "v2", "translation", {"texts": ["x"], "beam_size": 1}),
        response_key("p", "other", "v1", "translation", {"texts": ["x"], "beam_size": 1}),
        response_key("p", "m", "v1", "translation", {"texts": ["x"], "beam_size": 2}),
        response_key("p", "m", "v1", "translation", {"texts": ["x "], "beam_size": 1}),
        response_key("q", "m", "v1", "translation", {"texts": ["x"], "beam_size": 1}),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert response_key("p", "m", "v", "t", {"texts": ["\ud800 lone surrogate"]}).startswith("p:t:")


@pytest.mark.parametrize(
    ("use_cache", "header", "lookup", "store"),
    [
        (True, None, True, True),
        (False, None, False, True),
        (True, "no-cache", False, True),
        (True, "max-age=0", False, True),
        (True, "No-Store, no-cache", False, False),
        (True, "max-age=60", True, True),
    ],
)
def test_cache_control(use_cache: bool, header: str | None, lookup: bool, store: bool) -> None:
    assert CacheControl.of(use_cache, header) == CacheControl(lookup, store)


# --- the service with Redis --------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def settings_for(repo: Path, redis_url: str, **overrides: Any) -> Settings:
    return Settings(
        MODEL_REPOSITORY=repo,
        REDIS_URL=redis_url,
        CACHE_RETRY_INTERVAL_S=0.2,
        REDIS_TIMEOUT_S=0.2,
        **overrides,
    )


def post(client: httpx.Client, path: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    r = client.post(path, json=body, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()


def test_hits_misses_and_bypass_with_redis(tiny_models: Path, private_redis: RedisServer) -> None:
    settings = settings_for(tiny_models, private_redis.url, CACHE_KEY_PREFIX="t1")
    store = redis.Redis.from_url(private_redis.url)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body in [
            ("/v1/classify", TEXT),
            ("/v1/translate", TRANSLATE),
            ("/v1/generate", GREEDY),
            ("/v1/extract", QA),
        ]:
            miss = post(client, path, body)
            hit = post(client, path, body)
            assert (miss["cached"], hit["cached"]) == (False, True), path
            assert hit["results"] == miss["results"] and hit["usage"] == miss["usage"], path
            assert hit["model_version"] == miss["model_version"]
            # A single input and a one-item batch are the same request.
            plural = {"texts": [body["text"]]} if "text" in body else None
            if plural and path != "/v1/translate":
                assert post(client, path, plural)["cached"] is True, path
            # Asking for a fresh answer skips the look-up, in the body or with the header.
            assert post(client, path, {**body, "cache": False})["cached"] is False, path
            assert post(client, path, body, headers={"Cache-Control": "no-cache"})["cached"] is False, path

        # A different parameter is a different request.
        assert post(client, "/v1/translate", {**TRANSLATE, "beam_size": 2})["cached"] is False
        # Sampling without a seed is never cached; with a seed it is.
        sampled = {"prompt": "ROMEO:", "max_new_tokens": 8, "temperature": 0.9}
        assert [post(client, "/v1/generate", sampled)["cached"] for _ in range(2)] == [False, False]
        seeded = {**sampled, "seed": 7}
        assert [post(client, "/v1/generate", seeded)["cached"] for _ in range(2)] == [False, True]
        # top_k 1 leaves one token to draw: deterministic by the sampler's own definition, so cached too.
        one_token = {**sampled, "top_k": 1}
        assert [post(client, "/v1/generate", one_token)["cached"] for _ in range(2)] == [False, True]
        # Streams are never answered from the cache, even for a cached greedy request.
        with client.stream("POST", "/v1/generate", json={**GREEDY, "stream": True}) as r:
            assert r.status_code == 200 and "event: done" in r.read().decode()
        # no-store leaves nothing behind.
        keys_before = set(store.scan_iter("t1:*"))
        assert post(client, "/v1/classify", {"text": "never stored"}, headers={"Cache-Control": "no-store"})
        assert set(store.scan_iter("t1:*")) == keys_before
        # The entries really are in Redis, under the configured prefix, with a TTL.
        keys = list(store.scan_iter("t1:*"))
        assert keys and all(0 < store.pttl(k) <= 3600 * 1000 for k in keys)
        ready = client.get("/health/ready").json()
        assert (ready["cache"], ready["cache_backend"]) == ("ok", "redis")


def test_entries_expire_after_the_ttl(tiny_models: Path, private_redis: RedisServer) -> None:
    settings = settings_for(tiny_models, private_redis.url, CACHE_TTL_S=1.0)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert post(client, "/v1/classify", TEXT)["cached"] is False
        assert post(client, "/v1/classify", TEXT)["cached"] is True
        time.sleep(1.2)
        assert post(client, "/v1/classify", TEXT)["cached"] is False


def bump_version(model_dir: Path) -> str:
    """A new model version with the same behaviour: tokenizer.json re-serialised, the manifest rehashed."""
    tokenizer = model_dir / "tokenizer.json"
    tokenizer.write_text(json.dumps(json.loads(tokenizer.read_text()), indent=1))
    manifest_path = model_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    entry = manifest["files"]["tokenizer.json"]
    entry.update(sha256=file_sha256(tokenizer), bytes=tokenizer.stat().st_size)
    manifest["version"] = content_version(manifest["files"])
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return str(manifest["version"])


def test_a_new_model_version_misses_the_old_entries(model_repo: Path, private_redis: RedisServer) -> None:
    settings = settings_for(model_repo, private_redis.url)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        old = post(client, "/v1/classify", TEXT)
        assert post(client, "/v1/classify", TEXT)["cached"] is True
    new_version = bump_version(model_repo / "bert-classifier")
    assert new_version != old["model_version"]
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        fresh = post(client, "/v1/classify", TEXT)
        assert (fresh["cached"], fresh["model_version"]) == (False, new_version)
        assert fresh["results"] == old["results"]  # same behaviour, new identity
        assert post(client, "/v1/classify", TEXT)["cached"] is True


def test_redis_down_serves_uncached_and_recovers(tiny_models: Path, private_redis: RedisServer) -> None:
    settings = settings_for(tiny_models, private_redis.url)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert post(client, "/v1/classify", TEXT)["cached"] is False
        assert post(client, "/v1/classify", TEXT)["cached"] is True

        private_redis.stop()
        answers = [post(client, "/v1/classify", TEXT)["cached"] for _ in range(5)]
        answers += [post(client, "/v1/translate", TRANSLATE)["cached"] for _ in range(2)]
        assert answers == [False] * 7  # served, uncached, every one a 200
        assert metric(server.url, "tserve_cache_errors_total", backend="redis") >= 7
        ready = client.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["cache"] == "degraded"

        private_redis.start()  # same port, empty: the service finds it again by itself
        deadline = time.monotonic() + 10
        cached = False
        while not cached and time.monotonic() < deadline:
            time.sleep(0.25)
            cached = post(client, "/v1/classify", TEXT)["cached"]
        assert cached, "no cache hit within 10 s of Redis coming back"
        assert client.get("/health/ready").json()["cache"] == "ok"


def test_in_process_cache_is_the_default(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, REDIS_URL=None, CACHE_MAX_ENTRIES=1)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/health/ready").json()["cache_backend"] == "memory"
        assert [post(client, "/v1/classify", TEXT)["cached"] for _ in range(2)] == [False, True]
        post(client, "/v1/classify", {"text": "another"})  # a bound of one entry: evicts the first
        assert post(client, "/v1/classify", TEXT)["cached"] is False
