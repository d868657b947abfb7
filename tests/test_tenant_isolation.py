"""What one key may learn of the others (API_KEYS_FILE): a key with a model list sees only its models, on
every door (lists, indexes, 404 messages, metadata), a model it may not use answers exactly as an unknown
one does, and the prefix cache keeps each key's prompts to itself unless told to share them. Real servers
on loopback, the real clients (httpx, ``openai``, ``tritonclient`` over HTTP and gRPC)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from servers import LiveServer, metric
from tritonclient.utils import InferenceServerException

from harness.ports import free_port
from service.access.quotas import KeyEntry
from service.metadata import ANONYMOUS
from service.settings import Settings

KEYS = {"gpt-only": "key-of-the-gpt-tenant", "other": "key-of-another-tenant", "all": "key-of-everything"}
OTHERS = ("bert-classifier", "vit")  # served, and not gpt-only's


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def _grpc_auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}  # gRPC metadata names are lower-case


def _digest(name: str) -> str:
    return hashlib.sha256(KEYS[name].encode()).hexdigest()


KEYS_TOML = f"""
[[keys]]
id = "gpt-only"
sha256 = "{_digest("gpt-only")}"
models = ["gpt"]

[[keys]]
id = "other"
sha256 = "{_digest("other")}"

[[keys]]
id = "all"
sha256 = "{_digest("all")}"
"""


def _server(models: Path, keys: Path, **settings: Any) -> LiveServer:
    port = free_port()
    values: dict[str, Any] = {
        "MODEL_REPOSITORY": models,
        "SERVED_MODELS": ["gpt", *OTHERS],
        "API_KEYS_FILE": keys,
        "CACHE_ENABLED": False,
        "GRPC_PORT": port,
        "SHED_LAG_MS": 0,
    }
    server = LiveServer(Settings(**{**values, **settings}))
    server.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    return server


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(KEYS_TOML)
    return path


@pytest.fixture(scope="module")
def server(tiny_models: Path, keys_file: Path) -> Iterator[LiveServer]:
    with _server(tiny_models, keys_file) as live:
        yield live


def _leaks(text: str) -> list[str]:
    return [name for name in OTHERS if name in text]


# --- the lists ---------------------------------------------------------------------------------------


def test_a_keys_lists_name_only_its_models_on_every_door(server: LiveServer) -> None:
    listed = httpx.get(f"{server.url}/v1/models", headers=_auth("gpt-only"), timeout=30)
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["gpt"]
    assert _leaks(listed.text) == [], listed.text
    everything = httpx.get(f"{server.url}/v1/models", headers=_auth("all"), timeout=30).json()
    assert {m["id"] for m in everything["data"]} == {"gpt", *OTHERS}  # a key without a list sees them all

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["gpt-only"])
    assert [m.id for m in client.models.list()] == ["gpt"]

    index = httpx.post(f"{server.url}/v2/repository/index", json={}, headers=_auth("gpt-only"), timeout=30)
    assert index.status_code == 200 and [m["name"] for m in index.json()] == ["gpt"], index.text

    triton = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    assert [m["name"] for m in triton.get_model_repository_index(headers=_auth("gpt-only"))] == ["gpt"]

    grpc_client = tgrpc.InferenceServerClient(server.grpc_url)  # type: ignore[attr-defined]
    answer = grpc_client.get_model_repository_index(headers=_grpc_auth("gpt-only"))
    assert [m.name for m in answer.models] == ["gpt"]
    every = grpc_client.get_model_repository_index(headers=_grpc_auth("all"))
    assert {m.name for m in every.models} >= {"gpt", *OTHERS}


# --- a model it may not use is a model that does not exist ------------------------------------------


def _shape(message: str, name: str) -> str:
    """An answer with the model's name and the request's id taken out: what must not tell the two apart."""
    return re.sub(r'"request_id":\s*"[^"]*"', "", message.replace(name, "NAME"))


def test_a_forbidden_model_answers_as_an_unknown_one_on_rest_and_openai(server: LiveServer) -> None:
    for path, body in (
        ("/v1/classify", {"texts": ["fine"], "model": "{name}"}),
        ("/v1/generate", {"prompt": "KING:", "max_new_tokens": 2, "model": "{name}"}),
        ("/v1/completions", {"prompt": "KING:", "max_tokens": 2, "model": "{name}"}),
    ):
        answers = {}
        for name in ("bert-classifier", "no-such-model"):
            filled = {k: (v.format(name=name) if isinstance(v, str) else v) for k, v in body.items()}
            answers[name] = httpx.post(
                f"{server.url}{path}", json=filled, headers=_auth("gpt-only"), timeout=60
            )
        forbidden, unknown = answers["bert-classifier"], answers["no-such-model"]
        assert forbidden.status_code == unknown.status_code == 404, (path, forbidden.text, unknown.text)
        assert _shape(forbidden.text, "bert-classifier") == _shape(unknown.text, "no-such-model"), path
        assert "vit" not in forbidden.text and "gpt" in forbidden.text  # "loaded: gpt", its own only

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["gpt-only"])
    messages: dict[str, str] = {}
    for name in ("vit", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as raised:
            client.completions.create(model=name, prompt="KING:", max_tokens=2)
        messages[name] = _shape(str(raised.value), name)
    assert messages["vit"] == messages["no-such-model"]


def test_a_forbidden_model_answers_as_an_unknown_one_on_v2_http_and_grpc(server: LiveServer) -> None:
    headers = _auth("gpt-only")
    for suffix, method in (("", "GET"), ("/ready", "GET"), ("/config", "GET"), ("/infer", "POST")):
        answers = {
            name: httpx.request(
                method,
                f"{server.url}/v2/models/{name}{suffix}",
                headers=headers,
                json={"inputs": []},
                timeout=30,
            )
            for name in ("bert-classifier", "no-such-model")
        }
        forbidden, unknown = answers["bert-classifier"], answers["no-such-model"]
        assert forbidden.status_code == unknown.status_code, (suffix, forbidden.text, unknown.text)
        assert forbidden.status_code in (400, 404), (suffix, forbidden.text)
        assert _shape(forbidden.text, "bert-classifier") == _shape(unknown.text, "no-such-model"), suffix
        assert "vit" not in forbidden.text, suffix

    triton = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    assert triton.is_model_ready("bert-classifier", headers=headers) is False
    assert triton.is_model_ready("no-such-model", headers=headers) is False
    assert triton.is_model_ready("gpt", headers=headers) is True

    grpc_client = tgrpc.InferenceServerClient(server.grpc_url)  # type: ignore[attr-defined]
    headers = _grpc_auth("gpt-only")
    for call in (grpc_client.get_model_metadata, grpc_client.is_model_ready):  # (no ModelConfig on gRPC)
        found: dict[str, tuple[Any, str]] = {}
        for name in ("vit", "no-such-model"):
            with pytest.raises(InferenceServerException) as raised:
                call(name, headers=headers)
            found[name] = (raised.value.status(), _shape(raised.value.message(), name))
        assert found["vit"] == found["no-such-model"], found
        assert "NOT_FOUND" in str(found["vit"][0]) and "bert-classifier" not in found["vit"][1]
    assert grpc_client.get_model_metadata("gpt", headers=headers).name == "gpt"


def test_a_models_restriction_travels_in_the_requests_metadata() -> None:
    """The key check puts the key in the request's metadata, whatever opened it or ran before: the
    restriction holds wherever the metadata is passed, and nothing of it outlives the request."""
    entry = KeyEntry("gpt-only", _digest("gpt-only"), models=("gpt",))
    meta = ANONYMOUS.keyed(entry, "salt")
    key, names, after = meta.key, meta.visible(["gpt", "vit"]), ANONYMOUS.key
    assert key is entry and names == ["gpt"] and meta.prefix_salt == "salt"
    assert after is None  # the anonymous metadata is unchanged: a value, not a context


# --- the prefix cache -------------------------------------------------------------------------------

PROMPT = "KING HENRY: now is the winter of our discontent"  # characters: three blocks of 16 tokens


def _hits(server: LiveServer) -> float:
    return metric(server.url, "tserve_prefix_cache_hit_tokens_total", model="gpt")


def _generate(server: LiveServer, key: str) -> None:
    body = {"prompt": PROMPT, "max_new_tokens": 1, "temperature": 0, "model": "gpt"}
    answer = httpx.post(f"{server.url}/v1/generate", json=body, headers=_auth(key), timeout=120)
    assert answer.status_code == 200, answer.text


def test_one_keys_cached_prompt_is_not_reused_by_another_key(server: LiveServer) -> None:
    before = _hits(server)
    _generate(server, "all")
    assert _hits(server) == before  # first time: nothing cached
    _generate(server, "all")
    own = _hits(server) - before
    assert own > 0  # the same key's repeat reuses its blocks
    _generate(server, "other")
    assert _hits(server) - before == own  # another key reuses none of them
    _generate(server, "gpt-only")
    assert _hits(server) - before == own  # nor does a third
    _generate(server, "other")
    assert _hits(server) - before > own  # its own repeat, though, finds what it cached itself


def test_with_the_sharing_setting_every_key_reuses_every_others_prompt(
    tiny_models: Path, keys_file: Path
) -> None:
    with _server(tiny_models, keys_file, PREFIX_CACHE_SHARED_ACROSS_KEYS=True) as shared:
        _generate(shared, "all")
        before = _hits(shared)
        _generate(shared, "other")
        assert _hits(shared) > before


def test_grpc_requests_have_their_keys_prefix_cache_too(server: LiveServer) -> None:
    """The gRPC door notes the key's salt as the HTTP one does: a prompt cached over HTTP by one key is
    not reused by another key's gRPC generation."""
    prompt = "QUEEN MARGARET: so foul a sky clears not without"
    body = {"prompt": prompt, "max_new_tokens": 1, "temperature": 0, "model": "gpt"}
    assert (
        httpx.post(f"{server.url}/v1/generate", json=body, headers=_auth("all"), timeout=120).status_code
        == 200
    )
    before = _hits(server)
    grpc_client = tgrpc.InferenceServerClient(server.grpc_url)  # type: ignore[attr-defined]
    text = tgrpc.InferInput("prompt", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    grpc_client.infer("gpt", [text], headers=_grpc_auth("other"), parameters={"max_new_tokens": 1})
    assert _hits(server) == before
    grpc_client.infer("gpt", [text], headers=_grpc_auth("all"), parameters={"max_new_tokens": 1})
    assert _hits(server) > before
