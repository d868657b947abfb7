"""Quotas per API key (service/access/quotas.py): the keys file, the sliding windows, and real replicas sharing
one real redis-server on a free port, through both doors' key rules."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RedisServer
from servers import metric

from harness.service_process import ServiceProcess
from service.access.quotas import KeysFileError, LocalWindows, identify, load_keys_file

KEYS = {
    "team-a": "key-of-team-a",
    "team-b": "key-of-team-b",
    "tokens": "key-of-tokens",
    "gpt-only": "key-gpt",
}

KEYS_TOML = f"""
[[keys]]
id = "team-a"
sha256 = "{hashlib.sha256(KEYS["team-a"].encode()).hexdigest()}"
requests_per_minute = 10

[[keys]]
id = "team-b"
sha256 = "{hashlib.sha256(KEYS["team-b"].encode()).hexdigest()}"
priority = "high"

[[keys]]
id = "tokens"
sha256 = "{hashlib.sha256(KEYS["tokens"].encode()).hexdigest()}"
tokens_per_minute = 40

[[keys]]
id = "gpt-only"
sha256 = "{hashlib.sha256(KEYS["gpt-only"].encode()).hexdigest()}"
models = ["gpt"]
"""


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


# --- the keys file and the windows (no server) ------------------------------------------------------


def test_a_keys_file_in_toml_or_yaml_declares_ids_hashes_and_limits(tmp_path: Path) -> None:
    toml = tmp_path / "keys.toml"
    toml.write_text(KEYS_TOML)
    entries = load_keys_file(toml)
    assert [e.id for e in entries] == ["team-a", "team-b", "tokens", "gpt-only"]
    assert entries[0].requests_per_minute == 10 and entries[3].models == ("gpt",)
    assert identify(entries, KEYS["tokens"].encode()) == entries[2]
    assert identify(entries, b"not a key") is None
    yml = tmp_path / "keys.yaml"
    digest = hashlib.sha256(b"k").hexdigest()
    yml.write_text(f"keys:\n  - id: one\n    sha256: {digest}\n    tokens_per_minute: 5\n")
    assert load_keys_file(yml)[0].tokens_per_minute == 5
    yml.write_text(f"keys:\n  - id: one\n    sha256: {digest}\n    requests_per_minute: 0\n")
    with pytest.raises(KeysFileError, match=r"keys\[0\]\.requests_per_minute must be a positive integer"):
        load_keys_file(yml)
    yml.write_text("keys:\n  - id: one\n    sha256: short\n")
    with pytest.raises(KeysFileError, match="64 hex digits"):
        load_keys_file(yml)


def test_the_in_process_window_refuses_past_its_limit_and_charges_past_it_when_forced() -> None:
    async def scenario() -> None:
        windows = LocalWindows()
        counts = [await windows.hit("k", 3, 1) for _ in range(4)]
        assert [c.allowed for c in counts] == [True, True, True, False]
        assert counts[2].used == 3 and 0 < counts[3].reset_s <= 60
        forced = await windows.hit("t", 10, 25, force=True)  # tokens are charged whatever they come to
        assert forced.allowed and forced.used == 25
        assert (await windows.hit("t", 10, 0)).used == 25

    asyncio.run(scenario())


# --- replicas sharing one Redis ------------------------------------------------------------------


@pytest.fixture
def replicas(tiny_models: Path, tmp_path: Path) -> Iterator[tuple[list[ServiceProcess], RedisServer]]:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_TOML)
    redis = RedisServer(tmp_path)
    redis.start()
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "SERVED_MODELS": "gpt,bert-classifier",
        "API_KEYS_FILE": str(keys),
        "REDIS_URL": redis.url,
        "CACHE_ENABLED": "false",
        "ACCESS_LOG": "false",
        "REDIS_TIMEOUT_S": "0.5",
    }
    servers = [ServiceProcess(env, log_path=tmp_path / f"api{i}.log", stop_grace_s=0) for i in range(2)]
    try:
        for server in servers:
            server.start(ready_timeout_s=300)
        yield servers, redis
    finally:
        for server in servers:
            server.stop(grace_s=0)
        redis.stop()


def _classify(server: ServiceProcess, key: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/classify", json={"text": "a fine film"}, headers=_auth(key), timeout=60
    )


def test_a_keys_requests_per_minute_hold_across_replicas_and_leave_other_keys_alone(
    replicas: tuple[list[ServiceProcess], RedisServer],
) -> None:
    (first, second), _ = replicas
    answers = [_classify(first if n % 2 else second, "team-a") for n in range(10)]
    assert [a.status_code for a in answers] == [200] * 10
    assert (
        answers[-1].headers["RateLimit-Limit"] == "10" and answers[-1].headers["RateLimit-Remaining"] == "0"
    )
    for server in (first, second):  # the 11th, on either replica
        refused = _classify(server, "team-a")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "quota_exceeded"
        assert int(refused.headers["Retry-After"]) >= 1 and refused.headers["RateLimit-Remaining"] == "0"
        assert "team-a" in refused.json()["error"]["message"] and KEYS["team-a"] not in refused.text
    assert all(_classify(server, "team-b").status_code == 200 for server in (first, second))
    assert metric(first.url, "tserve_quota_refusals_total", key="team-a", limit="requests") == 1


def test_a_token_quota_spent_by_one_long_generation_refuses_the_next(
    replicas: tuple[list[ServiceProcess], RedisServer],
) -> None:
    (first, second), _ = replicas
    body = {"prompt": "KING:", "max_new_tokens": 60, "temperature": 0}
    long = httpx.post(f"{first.url}/v1/generate", json=body, headers=_auth("tokens"), timeout=60)
    assert long.status_code == 200
    assert long.json()["usage"]["total_tokens"] >= 40  # more than the key's tokens per minute
    refused = httpx.post(f"{second.url}/v1/generate", json=body, headers=_auth("tokens"), timeout=60)
    assert refused.status_code == 429 and "tokens per minute" in refused.json()["error"]["message"]
    assert (
        metric(first.url, "tserve_quota_tokens_total", key="tokens") == long.json()["usage"]["total_tokens"]
    )


def test_a_keys_model_list_answers_the_others_as_unknown_models(
    replicas: tuple[list[ServiceProcess], RedisServer],
) -> None:
    (first, _), _ = replicas
    refused = _classify(first, "gpt-only")
    assert refused.status_code == 404 and refused.json()["error"]["field"] == "model"
    # the task's default model is not its to use: to this key, no model serves the task
    assert refused.json()["error"]["message"] == "no loaded model serves text-classification"
    body = {"prompt": "KING:", "max_new_tokens": 4}
    assert (
        httpx.post(f"{first.url}/v1/generate", json=body, headers=_auth("gpt-only"), timeout=60).status_code
        == 200
    )


def test_with_redis_gone_quotas_fail_open_counted(replicas: tuple[list[ServiceProcess], RedisServer]) -> None:
    (first, _), redis = replicas
    redis.stop()
    answers = [_classify(first, "team-a") for _ in range(12)]  # past its 10 a minute: nothing counts now
    assert [a.status_code for a in answers] == [200] * 12
    assert metric(first.url, "tserve_quota_errors_total") >= 12
    assert "quota store failed" in first.log()
    assert first.log().count("quota store failed") == 1  # one warning a minute, not one a request


def test_the_fail_mode_is_the_operators_when_the_store_is_unreachable() -> None:
    from harness.ports import free_port
    from service.access.quotas import KeyEntry, Quotas, RedisWindows

    entry = KeyEntry("k", "0" * 64, requests_per_minute=5)

    async def scenario() -> None:
        nowhere = RedisWindows(f"redis://127.0.0.1:{free_port()}/0", "t", timeout_s=0.2)  # nothing listens
        try:
            opened = await Quotas(nowhere, fail_open=True).admit(entry)
            closed = await Quotas(nowhere, fail_open=False).admit(entry)
        finally:
            await nowhere.close()
        assert opened.allowed and not opened.unavailable
        assert not closed.allowed and closed.unavailable

    asyncio.run(scenario())


def test_workers_without_redis_refuse_to_start_with_limited_keys(tmp_path: Path) -> None:
    """Each worker would count a key's limits on its own: a key would get WORKERS times its entitlement."""
    import subprocess
    import sys

    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_TOML)
    env = {**os.environ, "API_KEYS_FILE": str(keys), "WORKERS": "2", "MODEL_REPOSITORY": str(tmp_path)}
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "service"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "WORKERS=2 without REDIS_URL" in done.stderr and "team-a" in done.stderr, done.stderr[-2000:]
