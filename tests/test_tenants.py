"""What one tenant may do to the others (API_KEYS_FILE): a key's priority has a ceiling on every door, every
token a stream generated is charged however the stream ends, and a refusal that did no work does not spend
the key's requests. A real server on loopback, a real redis-server for the quotas, the real clients."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from openai import OpenAI
from servers import LiveServer, metric
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from harness.ports import free_port
from service.access.quotas import KeysFileError, LocalWindows, load_keys_file
from service.context import current as current_request
from service.engine.scheduling import HIGH, LOW, NORMAL, Ceiling
from service.errors import KINDS, REFUNDED_STATUSES
from service.metadata import ANONYMOUS
from service.settings import Settings

KEYS = {
    "low": "key-of-a-low-tenant",  # default low, no max_priority: never above low
    "team": "key-of-a-normal-tenant",
    "raised": "key-that-may-ask-high",  # default normal, max_priority high
    "rest-stream": "key-rest-stream",
    "openai-stream": "key-openai-stream",
    "v2-stream": "key-v2-stream",
    "waited": "key-that-waits",
    "shed": "key-that-is-shed",
}


def _entry(name: str, **fields: Any) -> str:
    lines = [f'id = "{name}"', f'sha256 = "{hashlib.sha256(KEYS[name].encode()).hexdigest()}"']
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in fields.items()]
    return "[[keys]]\n" + "\n".join(lines) + "\n"


KEYS_TOML = "\n".join(
    [
        _entry("low", priority="low"),
        _entry("team", requests_per_minute=1000),
        _entry("raised", max_priority="high"),
        _entry("rest-stream", tokens_per_minute=20),
        _entry("openai-stream", tokens_per_minute=20),
        _entry("v2-stream", tokens_per_minute=20),
        _entry("waited", tokens_per_minute=5),
        _entry("shed", priority="low", requests_per_minute=2),
    ]
)


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def _keyed_server(models: Path, redis_url: str, keys: Path, **settings: Any) -> LiveServer:
    port = free_port()
    values: dict[str, Any] = {
        "MODEL_REPOSITORY": models,
        "SERVED_MODELS": ["bert-classifier", "gpt"],
        "API_KEYS_FILE": keys,
        "REDIS_URL": redis_url,
        "CACHE_KEY_PREFIX": f"tenants-{port}",  # the session's Redis is shared: this server's own counters
        "CACHE_ENABLED": False,
        "MAX_BATCH_SIZE": 1,
        "MAX_RUNNING_SEQUENCES": 4,
        "GRPC_PORT": port,
    }
    server = LiveServer(Settings(**{**values, **settings}))
    server.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    return server


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS_TOML)
    return keys


@pytest.fixture(scope="module")
def server(tiny_models: Path, redis_url: str, keys_file: Path) -> Iterator[LiveServer]:
    """Never sheds (SHED_LAG_MS=0): a low tenant's requests reach the queues whatever the machine's load
    does to the event loop's lag."""
    with _keyed_server(tiny_models, redis_url, keys_file, SHED_LAG_MS=0) as live:
        yield live


@pytest.fixture
def shedding_server(tiny_models: Path, redis_url: str, keys_file: Path) -> Iterator[LiveServer]:
    with _keyed_server(tiny_models, redis_url, keys_file) as live:
        yield live


# --- the ceiling, in the core's terms (no server) ---------------------------------------------------


def test_a_ceiling_lowers_a_more_urgent_class_in_every_block_nested_under_it() -> None:
    ceiling = Ceiling(NORMAL)
    keyed = ANONYMOUS.scheduled(LOW, ceiling=ceiling)  # the key's default class and ceiling
    assert keyed.scheduling.priority == LOW and ceiling.lowered_from is None
    asked = keyed.scheduled(HIGH)  # a door's header or body field, refining the key's metadata
    assert asked.scheduling.priority == NORMAL
    later = asked.with_body(None, 1.0)  # a deadline later on keeps the class and the ceiling
    assert later.scheduling.priority == NORMAL and later.scheduling.ceiling is ceiling
    assert ceiling.lowered_from == HIGH
    assert ANONYMOUS.scheduled(HIGH).scheduling.priority == HIGH  # no key: the class asked for


def test_a_keys_file_sets_each_keys_ceiling_and_refuses_a_default_above_it(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS_TOML)
    entries = {e.id: e for e in load_keys_file(path)}
    assert entries["low"].ceiling == "low"  # its default class
    assert entries["team"].ceiling == "normal"  # neither declared: normal, never above the others
    assert entries["raised"].ceiling == "high"
    path.write_text(_entry("low", priority="high", max_priority="normal"))
    with pytest.raises(KeysFileError, match=r"priority 'high' is more urgent than its max_priority 'normal'"):
        load_keys_file(path)
    path.write_text(_entry("low", max_priority="urgent"))
    with pytest.raises(KeysFileError, match="max_priority must be high, normal or low"):
        load_keys_file(path)


def test_the_refunded_statuses_carry_no_kind_that_did_work() -> None:
    """A refund is chosen by the answer's status: every kind with such a status is a refusal without work,
    but ``quota_exceeded``, which is sent before the request is counted."""
    for kind, spec in KINDS.items():
        if spec.status in REFUNDED_STATUSES:
            assert spec.refunded or kind == "quota_exceeded", kind


def test_a_take_back_never_goes_below_zero_nor_touches_another_minute() -> None:
    async def scenario() -> None:
        windows = LocalWindows()
        first = await windows.hit("k:requests", 2, 1)
        await windows.take_back("k:requests", first.minute, 1)
        await windows.take_back("k:requests", first.minute, 1)  # twice: still zero
        assert (await windows.hit("k:requests", 2, 0)).used == 0
        await windows.hit("k:requests", 2, 1)
        await windows.take_back("k:requests", first.minute - 60_000, 1)  # the minute before: nothing there
        assert (await windows.hit("k:requests", 2, 0)).used == 1

    asyncio.run(scenario())


# --- the ceiling on every door ------------------------------------------------------------------------


def _served_at(server: LiveServer, name: str) -> float:
    """How many items of class ``name`` the models' queues have handed out so far."""
    return metric(server.url, "tserve_priority_wait_seconds_count", priority=name)


class _AnsweredOrder(logging.Handler):
    """The request ids of the access log's lines, in the order the server wrote them (each as it answered)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.labels: list[str] = []
        self._logger = logging.getLogger("service.access")
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        context = current_request()
        if context is not None and "/v1/classify" in record.getMessage():
            self.labels.append(context.request_id)

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
        super().close()


def test_a_low_tenant_asking_high_waits_behind_a_normal_one_and_is_told(server: LiveServer) -> None:
    """The reported case: a key declared low sends ``X-Request-Priority: high`` (and the body's field). It
    is served at low, so it does not overtake another tenant's normal request queued before it, and its
    answer says at which class it was served."""
    answers: dict[str, httpx.Response] = {}
    done = _AnsweredOrder()  # the order the server finished them in (a client thread's order is a race)

    def send(label: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        headers = {**headers, "X-Request-ID": label}
        answers[label] = httpx.post(f"{server.url}/v1/classify", json=body, headers=headers, timeout=60)

    threads = [
        threading.Thread(target=send, args=("team", {"text": "first"}, _auth("team"))),
        threading.Thread(
            target=send,
            args=(
                "low",
                {"text": "second", "priority": "high"},
                {**_auth("low"), "X-Request-Priority": "high"},
            ),
        ),
    ]
    with server.held("bert-classifier") as held:
        for thread in threads:  # queued one after the other while the model is busy
            thread.start()
            assert held.queued.acquire(timeout=30), "a request never reached the queue"
    for thread in threads:
        thread.join(timeout=60)
    done.close()
    assert done.labels == ["team", "low"], {k: r.text for k, r in answers.items()}
    assert answers["low"].headers["X-Request-Priority-Served"] == "low"
    assert "X-Request-Priority-Served" not in answers["team"].headers  # asked for nothing above its ceiling


def test_a_key_may_ask_up_to_its_max_priority(server: LiveServer) -> None:
    before = _served_at(server, "high")
    r = httpx.post(
        f"{server.url}/v1/classify",
        json={"text": "urgent"},
        headers={**_auth("raised"), "X-Request-Priority": "high"},
        timeout=60,
    )
    assert r.status_code == 200 and "X-Request-Priority-Served" not in r.headers
    assert _served_at(server, "high") == before + 1


def test_every_door_serves_a_low_tenant_at_low_whatever_it_asks(server: LiveServer) -> None:
    """The class of the defect: the OpenAI field, the Open Inference Protocol's parameter on HTTP and gRPC."""
    high, low = _served_at(server, "high"), _served_at(server, "low")

    openai = OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["low"])
    raw = openai.completions.with_raw_response.create(
        model="gpt", prompt="KING:", max_tokens=2, temperature=0, extra_body={"priority": -1}
    )
    assert raw.headers["x-request-priority-served"] == "low"

    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}]}
    v2 = httpx.post(
        f"{server.url}/v2/models/bert-classifier/infer",
        json={**body, "parameters": {"priority": 1}},
        headers=_auth("low"),
        timeout=60,
    )
    assert v2.status_code == 200 and v2.headers["X-Request-Priority-Served"] == "low", v2.text

    with grpc.insecure_channel(server.grpc_url) as channel:  # type: ignore[attr-defined]
        stub = rpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="bert-classifier")
        request.parameters["priority"].int64_param = 1
        tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(b"fine")
        _, call = stub.ModelInfer.with_call(request, metadata=(("authorization", f"Bearer {KEYS['low']}"),))
        assert dict(call.trailing_metadata())["x-request-priority-served"] == "low"

    assert _served_at(server, "high") == high  # none of the four was served at high
    assert _served_at(server, "low") >= low + 3  # the completion's sequence, v2's and gRPC's items


def test_without_keys_a_request_keeps_the_class_it_asks(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["bert-classifier"], CACHE_ENABLED=False)
    with LiveServer(settings) as live:
        before = _served_at(live, "high")
        r = httpx.post(
            f"{live.url}/v1/classify", json={"text": "a"}, headers={"X-Request-Priority": "high"}, timeout=60
        )
        assert r.status_code == 200 and "X-Request-Priority-Served" not in r.headers
        assert _served_at(live, "high") == before + 1


# --- every token a stream generated is charged ------------------------------------------------------


def _charged(server: LiveServer, key: str) -> float:
    return metric(server.url, "tserve_quota_tokens_total", key=key)


def _hang_up_after(url: str, path: str, body: Any, headers: dict[str, str], events: int) -> int:
    """POST a streamed request, read ``events`` of its data lines, then close the connection."""
    seen = 0
    with (
        httpx.Client(base_url=url, timeout=120) as client,
        client.stream("POST", path, json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and "[DONE]" not in line:
                seen += 1
                if seen == events:
                    break
    return seen


@pytest.mark.parametrize(
    ("key", "path", "body"),
    [
        (
            "rest-stream",
            "/v1/generate",
            {"prompt": "KING:", "max_new_tokens": 60, "temperature": 0, "stream": True},
        ),
        (
            "openai-stream",
            "/v1/completions",
            {"model": "gpt", "prompt": "KING:", "max_tokens": 60, "stream": True},
        ),
        (
            "v2-stream",
            "/v2/models/gpt/generate_stream",
            {"text_input": "KING:", "parameters": {"max_tokens": 60, "temperature": 0}},
        ),
    ],
)
def test_a_stream_cut_short_is_charged_every_token_it_generated(
    server: LiveServer, key: str, path: str, body: dict[str, Any]
) -> None:
    """The reported case, on each streaming door: with 20 tokens a minute, a client that reads 25 streamed
    tokens and resets the connection was charged nothing, and its next request got 200."""
    read = _hang_up_after(server.url, path, body, _auth(key), events=25)
    assert read == 25
    deadline = time.monotonic() + 10  # the charge is made as the response ends, after the hang-up
    while _charged(server, key) < read and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _charged(server, key) >= read + 1  # the prompt's tokens and every token read, at least
    again = httpx.post(
        f"{server.url}/v1/generate",
        json={"prompt": "KING:", "max_new_tokens": 2},
        headers=_auth(key),
        timeout=60,
    )
    assert again.status_code == 429 and again.json()["error"]["type"] == "quota_exceeded", again.text


def test_a_generation_whose_client_left_before_the_answer_is_charged_too(server: LiveServer) -> None:
    """Not streamed: the client gives up while its generation waits (the model kept busy); its prompt, read
    into the queue, is still spent. The prompt alone (12 tokens) is over the key's 5 a minute, with a margin:
    the window slides, so a prompt of exactly 5 would weigh under 5 once a minute's boundary passed between
    the charge and the next request (it did, on a loaded machine)."""
    busy = server.occupy("gpt", 1.5)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{server.url}/v1/generate",
                json={"prompt": "KING RICHARD:", "max_new_tokens": 20, "temperature": 0},
                headers=_auth("waited"),
                timeout=httpx.Timeout(60, read=0.3),
            )
    finally:
        busy.result(timeout=30)
    deadline = time.monotonic() + 10
    while _charged(server, "waited") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _charged(server, "waited") >= 12  # at least the prompt's tokens
    again = httpx.post(f"{server.url}/v1/classify", json={"text": "a"}, headers=_auth("waited"), timeout=60)
    assert again.status_code == 429, again.text


# --- a refusal that did no work does not spend the key's requests -----------------------------------


def test_shed_requests_do_not_spend_the_keys_requests(shedding_server: LiveServer) -> None:
    """A key of two requests a minute, whose default class is low: shed three times while the loop lags,
    it still has both of its requests afterwards (and a third is refused by its quota)."""
    stop = threading.Event()

    async def hog() -> None:
        while not stop.is_set():
            time.sleep(0.05)  # blocks the loop, as a burst of requests does
            await asyncio.sleep(0.005)

    hogging = shedding_server.on_loop(hog())
    try:
        time.sleep(0.3)
        shed = [
            httpx.post(
                f"{shedding_server.url}/v1/classify", json={"text": "x"}, headers=_auth("shed"), timeout=30
            )
            for _ in range(3)
        ]
    finally:
        stop.set()
        hogging.result(timeout=10)
    assert [r.json()["error"]["type"] for r in shed] == ["shed"] * 3, [r.text for r in shed]
    assert metric(shedding_server.url, "tserve_quota_refunds_total", key="shed") == 3
    # the loop on time again: on a busy machine a request may still be shed now and then, and each shed one
    # is given back too, so keep asking until three answers are not sheds
    served: list[httpx.Response] = []
    for _ in range(50):
        r = httpx.post(
            f"{shedding_server.url}/v1/classify", json={"text": "x"}, headers=_auth("shed"), timeout=30
        )
        if r.status_code == 429 and r.json()["error"]["type"] == "shed":
            time.sleep(0.1)
            continue
        served.append(r)
        if len(served) == 3:
            break
    assert [r.status_code for r in served] == [200, 200, 429], [r.text for r in served]
    assert served[2].json()["error"]["type"] == "quota_exceeded"


def test_grpc_calls_refused_without_work_are_refunded_too(server: LiveServer) -> None:
    """A deadline that passes while the call waits (DEADLINE_EXCEEDED, never computed) is given back."""
    before = metric(server.url, "tserve_quota_refunds_total", key="team")
    client = tgrpc.InferenceServerClient(server.grpc_url)  # type: ignore[attr-defined]
    tensor = tgrpc.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"late"], dtype=object))
    try:
        with (
            server.one_taken("bert-classifier", _auth("team")),
            pytest.raises(Exception, match=r"DEADLINE_EXCEEDED|Deadline"),
        ):
            client.infer(
                "bert-classifier",
                [tensor],
                headers={"authorization": f"Bearer {KEYS['team']}"},
                timeout=100_000,  # µs: 0.1 s, while the batcher holds another request for the busy model
            )
    finally:
        client.close()
    deadline = time.monotonic() + 5
    while (
        metric(server.url, "tserve_quota_refunds_total", key="team") == before and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert metric(server.url, "tserve_quota_refunds_total", key="team") == before + 1
