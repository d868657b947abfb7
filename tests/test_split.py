"""The split service (FRONTENDS >= 1): front-end processes and one engine process over ZeroMQ.

A real ``python -m service`` with FRONTENDS=2 on the tiny models: every door answers through the split,
number for number as one process answers; the models change through the engine; and the faults the
split brings: an engine that dies (the front ends answer 503 with Retry-After until a new one serves,
which also proves the front ends had no model of their own), a front end that dies (its sequences end in
the engine, the other front end serves on), and SIGTERM (the front ends drain, then the engine; no
process is left).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from servers import LiveServer, metric

from harness.ports import free_port
from harness.service_process import ServiceProcess
from service.settings import Settings

SERVED = "bert-classifier,bert-tagger,bert-qa,bert-embedder,bert-reranker,gpt,translator,vit"


def _split(models: Path, log: Path, **env: str) -> ServiceProcess:
    settings = {
        "MODEL_REPOSITORY": str(models),
        "SERVED_MODELS": SERVED,
        "FRONTENDS": "2",
        "CACHE_ENABLED": "false",
        "GRPC_PORT": str(free_port()),
        "ACCESS_LOG": "false",
        "SHUTDOWN_TIMEOUT_S": "10",
        **env,
    }
    return ServiceProcess(settings, log_path=log, stop_grace_s=20)


def _children(pid: int) -> list[tuple[int, str]]:
    """Every descendant of ``pid`` with its command line."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append((int(entry.name), ppid, cmdline))
    found, frontier = [], {pid}
    while frontier:
        nxt = {p for p, parent, _ in out if parent in frontier}
        found += [(p, c) for p, parent, c in out if parent in frontier]
        frontier = nxt
    return found


def _engine_pid(server: ServiceProcess) -> int:
    assert server.proc is not None
    engines = [p for p, cmd in _children(server.proc.pid) if "service.engine_host" in cmd]
    assert len(engines) == 1, _children(server.proc.pid)
    return engines[0]


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _holds_connection(pid: int, port: int, client_port: int) -> bool:
    """Whether process ``pid`` holds the server's side of the established connection from ``client_port``
    to ``port`` on loopback."""
    inodes = _socket_inodes(pid)
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == client_port:
            return state == "01" and inode in inodes
    return False


def _connections(pid: int, port: int) -> int:
    """How many established TCP connections to ``port`` the process ``pid`` holds (the server's side)."""
    inodes = _socket_inodes(pid)
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port, state, inode = int(fields[1].split(":")[1], 16), fields[3], fields[9]
        count += local_port == port and state == "01" and inode in inodes
    return count


@pytest.fixture(scope="module")
def split(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    log = tmp_path_factory.mktemp("split") / "service.log"
    with _split(tiny_models, log, MODEL_CONTROL_MODE="explicit") as server:
        yield server


@pytest.fixture(scope="module")
def one_process(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=SERVED.split(","), CACHE_ENABLED=False)
    with LiveServer(settings) as live:
        yield live


# --- the process model -------------------------------------------------------------------------------------


def test_the_service_runs_as_one_engine_and_two_front_ends(split: ServiceProcess) -> None:
    assert split.proc is not None
    tree = _children(split.proc.pid)
    engine = _engine_pid(split)
    frontends = [p for p, cmd in tree if p != engine and "spawn_main" in cmd]
    assert len(frontends) == 2, tree
    deadline = time.monotonic() + 10  # each front end says hello to the engine
    while split.log().count("front end ") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {f"front end {pid} connected" in split.log() for pid in frontends} == {True}, split.log()[-3000:]


# --- every door, as one process answers -------------------------------------------------------------------

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/classify", {"texts": ["a fine film", "a dull one"], "top_k": 2}),
    ("/v1/classify", {"text": "a fine film", "return_attention": True}),
    ("/v1/extract", {"task": "entities", "text": "Ada Lovelace lived in London."}),
    ("/v1/extract", {"task": "qa", "question": "Where did Ada live?", "context": "Ada lived in London."}),
    ("/v1/embed", {"texts": ["hello", "world"]}),
    ("/v1/translate", {"text": "A man is riding a bicycle.", "beam_size": 2, "num_return_sequences": 2}),
    ("/v1/generate", {"prompt": "KING:", "max_new_tokens": 8, "temperature": 0}),
    ("/v1/generate", {"prompt": "KING:", "max_new_tokens": 8, "temperature": 0.8, "seed": 3}),
    (
        "/v1/completions",
        {"model": "gpt", "prompt": "KING:", "max_tokens": 6, "n": 2, "seed": 5, "logprobs": 2},
    ),
    ("/v1/embeddings", {"model": "bert-embedder", "input": ["one", "two"]}),
    (
        "/v2/models/bert-classifier/infer",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}]},
    ),
    ("/v1/rerank", {"query": "who plays?", "documents": ["a guitar player", "rates rose"], "top_n": 1}),
    ("/v1/score", {"queries": ["a", "b"], "documents": ["c", "d"]}),
    ("/v1/score", {"model": "bert-embedder", "text_1": "a", "text_2": ["c", "d"]}),  # by cosine
    ("/rerank", {"query": "who plays?", "texts": ["a guitar player", "rates rose"], "truncate": True}),
    ("/embed", {"inputs": ["hello", "world"], "truncation_direction": "left"}),
    ("/tokenize", {"inputs": "hello world"}),
    (
        "/models/bert-tagger",
        {"inputs": "Ada Lovelace lived in London.", "parameters": {"aggregation_strategy": "max"}},
    ),
]


def _comparable(body: Any) -> Any:
    """An answer without what differs between two servers by design (ids, timestamps)."""
    if isinstance(body, dict):
        return {k: _comparable(v) for k, v in body.items() if k not in ("id", "created", "request_id")}
    if isinstance(body, list):
        return [_comparable(v) for v in body]
    return body


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=[f"{p} {i}" for i, (p, _) in enumerate(REQUESTS)])
def test_every_door_answers_through_the_split_as_one_process_does(
    split: ServiceProcess, one_process: LiveServer, path: str, body: dict[str, Any]
) -> None:
    there = httpx.post(f"{split.url}{path}", json=body, timeout=120)
    here = httpx.post(f"{one_process.url}{path}", json=body, timeout=120)
    assert there.status_code == here.status_code == 200, (there.text, here.text)
    assert _comparable(there.json()) == _comparable(here.json())


def test_streams_and_the_tensor_doors_answer_through_the_split(
    split: ServiceProcess, one_process: LiveServer
) -> None:
    body = {"prompt": "KING:", "max_new_tokens": 10, "temperature": 0, "stream": True}
    streamed = []
    for url in (split.url, one_process.url):
        with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=120) as r:
            assert r.status_code == 200
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
        streamed.append([_comparable(e) for e in events])
    assert streamed[0] == streamed[1] and len(streamed[0]) == 11  # ten tokens, then done
    with httpx.stream(
        "POST",
        f"{split.url}/v2/models/gpt/generate_stream",
        json={"text_input": "KING:", "parameters": {"max_tokens": 4, "temperature": 0}},
        timeout=120,
    ) as r:  # greedy: a sampled draw may end at the end-of-text token before the fourth
        assert r.status_code == 200
        chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert len(chunks) == 5 and chunks[-1]["finish_reason"] == "length", chunks

    http = thttp.InferenceServerClient(split.url.removeprefix("http://"))
    text = thttp.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a fine film", b"dull"], dtype=object))
    labels_http = http.infer("bert-classifier", [text]).as_numpy("label")  # binary tensors
    grpc_client = tgrpc.InferenceServerClient(f"127.0.0.1:{split.env['GRPC_PORT']}")
    text = tgrpc.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a fine film", b"dull"], dtype=object))
    labels_grpc = grpc_client.infer("bert-classifier", [text]).as_numpy("label")
    here = httpx.post(
        f"{one_process.url}/v1/classify", json={"texts": ["a fine film", "dull"]}, timeout=60
    ).json()
    assert (
        [x.decode() for x in labels_http]
        == [x.decode() for x in labels_grpc]
        == [r["label"] for r in here["results"]]
    )
    assert grpc_client.is_model_ready("gpt") and grpc_client.is_model_ready("translator")
    grpc_client.close()
    http.close()


def test_errors_cross_the_split_as_they_are(split: ServiceProcess) -> None:
    """The engine's refusals reach the client as one process answers them: a prompt over the context (422,
    found in the engine), an unknown model (404), a bad parameter (422)."""
    long = httpx.post(f"{split.url}/v1/generate", json={"prompt": "to be or not " * 300}, timeout=60)
    assert long.status_code == 422 and long.json()["error"]["field"] == "prompt", long.text
    unknown = httpx.post(f"{split.url}/v1/classify", json={"text": "x", "model": "nope"}, timeout=60)
    assert unknown.status_code == 404
    bad = httpx.post(f"{split.url}/v1/generate", json={"prompt": "x", "temperature": -1}, timeout=60)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "temperature"


def test_models_change_through_the_engine_and_every_front_end_follows(split: ServiceProcess) -> None:
    http = thttp.InferenceServerClient(split.url.removeprefix("http://"), network_timeout=120)
    http.unload_model("bert-tagger")
    body = {"task": "entities", "text": "Ada lived in London.", "model": "bert-tagger"}
    for _ in range(6):  # both front ends: several connections
        assert httpx.post(f"{split.url}/v1/extract", json=body, timeout=60).status_code == 404
    assert not http.is_model_ready("bert-tagger")
    http.load_model("bert-tagger")
    for _ in range(6):
        assert httpx.post(f"{split.url}/v1/extract", json=body, timeout=60).status_code == 200
    states = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert states["bert-tagger"] == "READY"
    http.close()


def test_a_stream_whose_client_leaves_ends_in_the_engine(split: ServiceProcess) -> None:
    """A streamed completion of 128 choices: 16 decode at a time (MAX_RUNNING_SEQUENCES), the others wait
    their turn, so most are unfinished whatever a loaded machine's timing (one tiny-GPT sequence ends
    within its 64-token context before a slow client reads its first token). The client hangs up after
    the first token; the engine is held (SIGSTOP) meanwhile, so that the abort reaches it before it
    decodes on. Every sequence then ends in the engine: dropped there, or finished before the hang-up."""
    n = 128
    dropped = {"model": "gpt", "reason": "client_disconnected"}
    body = {"model": "gpt", "prompt": "KING:", "max_tokens": 59, "n": n, "temperature": 1, "stream": True}
    engine = _engine_pid(split)
    before = metric(split.url, "tserve_requests_dropped_total", **dropped)
    finished = metric(split.url, "tserve_generations_total", model="gpt")
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{split.url}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                os.kill(engine, signal.SIGSTOP)
                break  # hang up after the first token
    try:
        time.sleep(1.0)  # less than ENGINE_SILENT_S: the front end does not judge the engine gone
    finally:
        os.kill(engine, signal.SIGCONT)

    def ended() -> tuple[float, float]:
        return (
            metric(split.url, "tserve_requests_dropped_total", **dropped) - before,
            metric(split.url, "tserve_generations_total", model="gpt") - finished,
        )

    deadline = time.monotonic() + 30
    while sum(ended()) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    cut, done = ended()
    assert cut >= 1 and cut + done == n, (cut, done)  # dropped in the engine, the rest finished first


# --- faults ----------------------------------------------------------------------------------------------


def test_an_engine_that_dies_is_replaced_and_the_front_ends_answer_503_meanwhile(
    tiny_models: Path, tmp_path: Path
) -> None:
    """Also the proof that the front ends run no model: with the engine gone, none of them answers."""
    with _split(tiny_models, tmp_path / "service.log", SERVED_MODELS="bert-classifier") as server:
        assert httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, timeout=60).status_code == 200
        engine = _engine_pid(server)
        os.kill(engine, signal.SIGKILL)
        refused, not_ready = None, False
        deadline = time.monotonic() + 15
        while (refused is None or not not_ready) and time.monotonic() < deadline:
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, timeout=60)
            if r.status_code != 200 and refused is None:
                refused = r
            not_ready = not_ready or httpx.get(f"{server.url}/health/ready", timeout=10).status_code == 503
            time.sleep(0.05)
        assert refused is not None and refused.status_code == 503, refused
        assert int(refused.headers["retry-after"]) >= 1
        assert not_ready  # readiness said so while there was no engine
        # the supervisor starts another, which loads and warms up; each front end serves again once it has
        # heard what the new engine serves: until eight requests in a row (new connections, either front
        # end) are answered
        deadline, in_a_row = time.monotonic() + 120, 0
        while in_a_row < 8 and time.monotonic() < deadline:
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, timeout=60)
            in_a_row = in_a_row + 1 if r.status_code == 200 else 0
            if r.status_code != 200:
                assert r.status_code == 503, r.text  # nothing but "retry shortly" meanwhile
                time.sleep(0.2)
        assert in_a_row == 8
        assert _engine_pid(server) != engine
        assert "starting another" in server.log()


def test_a_front_end_that_dies_has_its_sequences_ended_and_the_other_serves_on(
    tiny_models: Path, tmp_path: Path
) -> None:
    with _split(
        tiny_models, tmp_path / "service.log", SERVED_MODELS="gpt,bert-classifier", MAX_RUNNING_SEQUENCES="1"
    ) as server:
        assert server.proc is not None
        outcomes: list[str] = []
        stop = threading.Event()

        def ask(stream: bool) -> None:
            # the tiny GPT's context ends a sequence within 64 tokens: a client asks for many, decoded one
            # after another (MAX_RUNNING_SEQUENCES=1), so that its connection stays open a while, and asks
            # again on a new connection each time (the kernel hands each to either front end)
            path = "/v1/completions" if stream else "/v1/generate"
            body: dict[str, Any] = (
                {
                    "model": "gpt",
                    "prompt": "KING:",
                    "max_tokens": 59,
                    "n": 12,
                    "temperature": 1,
                    "stream": True,
                }
                if stream
                else {"prompts": ["KING:"] * 16, "max_new_tokens": 59, "temperature": 1}
            )
            while not stop.is_set():
                try:
                    with (
                        httpx.Client(timeout=60) as c,
                        c.stream("POST", f"{server.url}{path}", json=body) as r,
                    ):
                        if r.status_code != 200:
                            outcomes.append(f"status {r.status_code}")
                            continue
                        lines = list(r.iter_lines())
                    done = "data: [DONE]" in lines if stream else json.loads("".join(lines))["results"] != []
                    outcomes.append("done" if done else "cut")
                except (httpx.HTTPError, ValueError):  # a connection lost, or a body cut short
                    outcomes.append("cut")

        threads = [threading.Thread(target=ask, args=(i % 2 == 0,)) for i in range(8)]
        for t in threads:
            t.start()
        victim_body = {"model": "gpt", "prompt": "KING:", "max_tokens": 59, "n": 12, "temperature": 1}
        try:
            time.sleep(1.5)  # the streams are running on both front ends
            engine = _engine_pid(server)
            port = int(server.url.rsplit(":", 1)[1])
            # A stream known to be in flight: its first event has arrived and its last should not have (its
            # twelve sequences queue behind the other clients' for the one running place). The front end
            # holding its connection is the one killed. A loaded client may read that first event only after
            # the whole stream is in its buffer (eight threads share its interpreter): then the stream was
            # over before the kill, which proves nothing, and a new victim is tried (three at most).
            for _ in range(3):
                frontends = [
                    p for p, cmd in _children(server.proc.pid) if p != engine and "spawn_main" in cmd
                ]
                with (
                    httpx.Client(timeout=60) as c,
                    c.stream(
                        "POST", f"{server.url}/v1/completions", json={**victim_body, "stream": True}
                    ) as r,
                ):
                    assert r.status_code == 200
                    lines = r.iter_lines()
                    first = next(line for line in lines if line.startswith("data:"))
                    assert first != "data: [DONE]"
                    client_port = r.extensions["network_stream"].get_extra_info("socket").getsockname()[1]
                    held = {pid: _connections(pid, port) for pid in frontends}
                    holder = [pid for pid in frontends if _holds_connection(pid, port, client_port)]
                    assert len(holder) == 1, (holder, held)
                    frontends.sort(key=lambda pid: pid != holder[0])
                    before = len(outcomes)
                    os.kill(frontends[0], signal.SIGKILL)
                    try:
                        rest = list(lines)
                        victim = "done" if "data: [DONE]" in rest else "cut"
                    except (httpx.HTTPError, ValueError):
                        victim = "cut"
                    outcomes.append(victim)
                deadline = time.monotonic() + 10
                while f"front end {frontends[0]} is gone" not in server.log() and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(1)
                if victim == "cut":
                    break
                deadline = time.monotonic() + 60  # the killed front end's replacement serves first
                while time.monotonic() < deadline:
                    pids = [p for p, cmd in _children(server.proc.pid) if p != engine and "spawn_main" in cmd]
                    if len([p for p in pids if f"front end {p} connected" in server.log()]) >= 2:
                        break
                    time.sleep(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert f"front end {frontends[0]} is gone" in server.log(), server.log()[-3000:]
        assert set(outcomes) <= {"done", "cut"}, outcomes  # every stream was answered, none refused
        assert "cut" in outcomes[before:], (
            held,
            outcomes[before:],
        )  # the killed front end's clients lost their connection
        assert "done" in outcomes[before:], outcomes  # and the other front end served on
        assert httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, timeout=60).status_code == 200


def test_sigterm_drains_the_front_ends_then_the_engine_and_leaves_no_process(
    tiny_models: Path, tmp_path: Path
) -> None:
    server = _split(tiny_models, tmp_path / "service.log", SERVED_MODELS="gpt")
    server.start()
    assert server.proc is not None
    tree = [p for p, _ in _children(server.proc.pid)]
    result: dict[str, Any] = {}

    def stream() -> None:
        body = {"prompt": "KING:", "max_new_tokens": 60, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{server.url}/v1/generate", json=body) as r:
            result["lines"] = [line for line in r.iter_lines() if line.startswith("event:")]

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(0.5)
    server.proc.send_signal(signal.SIGTERM)
    reader.join(timeout=60)
    assert server.proc.wait(timeout=60) == 0
    assert result["lines"][-1] == "event: done", result  # the stream in flight finished: drained
    deadline = time.monotonic() + 10  # multiprocessing's resource tracker leaves once its pipe closes
    while (alive := [p for p in tree if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = {
        p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in alive if Path(f"/proc/{p}").exists()
    }
    assert alive == [], leftovers
    server.close()


def test_the_wire_carries_arrays_without_a_copy_and_errors_as_they_were() -> None:
    """The payloads' codec: arrays out of band (each its own frame), errors rebuilt with their fields."""
    from service.engine.errors import QueueFullError
    from service.errors import InvalidInputError
    from service.ipc.payloads import decode_values, encode_values

    small, large = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(64 * 1024, dtype=np.float32)
    frames = encode_values([small, large, {"ids": [1, 2]}])
    assert len(frames) == 2 and bytes(frames[1]) == large.tobytes()  # the large one out of band
    first, second, third = decode_values(frames)
    assert np.array_equal(first.value(np.ndarray), small) and first.value(np.ndarray).shape == (3, 4)
    assert np.array_equal(second.value(np.ndarray), large)
    assert np.shares_memory(second.value(np.ndarray), np.frombuffer(frames[1], np.uint8))  # no copy
    assert third.value(dict[str, list[int]]) == {"ids": [1, 2]}
    [error] = decode_values(encode_values([QueueFullError("m", 3, 2, displaced=True)]))
    rebuilt = error.error()
    assert isinstance(rebuilt, QueueFullError) and rebuilt.retry_after_s == 2 and rebuilt.displaced
    [invalid] = decode_values(encode_values([InvalidInputError("too long", "inputs", "too_long", 1)]))
    rebuilt = invalid.error()
    assert isinstance(rebuilt, InvalidInputError)
    assert (rebuilt.field, rebuilt.reason, rebuilt.index) == ("inputs", "too_long", 1)
    [other] = decode_values(encode_values([KeyError("x")]))  # not one of the service's: its message crosses
    assert type(other.error()).__name__ == "EngineError" and "KeyError" in str(other.error())


def test_every_item_and_result_crosses_as_its_declared_type() -> None:
    """One item and one result of every task, encoded and decoded into the types ``payloads`` declares, come
    back equal, dataclasses and arrays included; a value of no declared type does not encode."""
    from service.engine.generation_contract import GenerationRequest, GenerationResult
    from service.engine.sampling import SamplingParams, TokenLogprob
    from service.engine.seq2seq import Hypothesis, RowControls
    from service.engine.structured_output import StructuredOutput
    from service.ipc.payloads import (
        GENERATION,
        ITEMS,
        RESULTS,
        decode_values,
        encode_values,
        items_of,
        results_of,
    )
    from service.pipelines.classify import PairIds
    from service.pipelines.embed import Vectors
    from service.pipelines.factory import PIPELINES
    from service.pipelines.qa_spans import QAWindow, Span
    from service.pipelines.translate import SourceItem

    batched = {task for task, cls in PIPELINES.items() if task != "text-generation"}
    assert set(ITEMS) == set(RESULTS) == batched, "every batched task declares its item and its result"
    vector = np.linspace(0, 1, 8, dtype=np.float32)
    items = {
        "text-classification": [[101, 7, 102], PairIds([101, 7, 102, 9, 102], [0, 0, 0, 1, 1])],
        "image-classification": [np.zeros((4, 4, 3), np.uint8)],
        "translation": [
            SourceItem([5, 6], 2, 10, 1.0, 1, RowControls((3,), 1, 2, 1.1, ((4, 5),), 1), (7, 8))
        ],
        "question-answering": [[QAWindow([1, 2, 3], [0, 1, 1], [None, (0, 4), (5, 9)])]],
        "token-classification": [[1, 2, 3]],
        "feature-extraction": [[1, 2]],
        "rerank": [PairIds([101, 7, 102, 9, 102], [0, 0, 0, 1, 1])],
    }
    results = {
        "text-classification": [vector],
        "image-classification": [vector],
        "translation": [[Hypothesis([1, 2], -0.5, -0.25, True, [-0.1, -0.4])]],
        "question-answering": [Span(0, 4, 0.9, 0), None],
        "token-classification": [np.ones((3, 5), np.float32)],
        "feature-extraction": [Vectors(vector, vector * 2)],
        "rerank": [-1.25, 3.5],
    }

    def same(a: object, b: object) -> bool:
        if isinstance(a, np.ndarray):
            return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(a, Vectors):
            return isinstance(b, Vectors) and same(a.normalized, b.normalized) and same(a.pooled, b.pooled)
        if isinstance(a, list):
            return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
        return type(a) is type(b) and a == b

    for task in batched:
        for declared, values in ((items_of(task), items[task]), (results_of(task), results[task])):
            [payload] = decode_values(encode_values([values]))
            assert same(values, payload.value(declared)), task

    sampling = SamplingParams(
        max_new_tokens=4,
        temperature=0.5,
        stop=("\n",),
        seed=3,
        logit_bias=((1, -100.0),),
        min_tokens=1,
        structured_outputs=StructuredOutput("regex", "[ab]+"),
        logprobs=2,
    )
    generation = [GenerationRequest([1, 2, 3], sampling, "req-1", "salt")]
    token = TokenLogprob(5, -0.5, ((5, -0.5), (6, -1.5)))
    result = GenerationResult([5, 6], "ab", "stop", 3, 2, 0.01, 0.02, [token, token], [TokenLogprob(1, None)])
    for name, value in (("requests", generation), ("token", token), ("result", result)):
        [payload] = decode_values(encode_values([value]))
        assert payload.value(GENERATION[name]) == value, name

    with pytest.raises(TypeError, match="not a declared payload type"):
        encode_values([object()])
    [wrong] = decode_values(encode_values([["not", "ids"]]))
    with pytest.raises(msgspec.ValidationError):
        wrong.value(items_of("token-classification"))


def test_the_wire_protocol_is_the_one_written_down() -> None:
    """Every payload type's fields, as ``payloads.protocol()`` describes them, are tests/wire_protocol.json:
    a field added to an item, a result or a call, changes that file on purpose, never the wire by accident
    (regenerate it with ``python -c 'import json; from service.ipc.payloads import protocol;
    print(json.dumps(protocol(), indent=1))' > tests/wire_protocol.json`` once the change is meant)."""
    from service.ipc.payloads import protocol

    written = json.loads((Path(__file__).parent / "wire_protocol.json").read_text())
    assert protocol() == written


def test_a_front_end_sheds_low_priority_by_the_engines_queue(tiny_models: Path, tmp_path: Path) -> None:
    """The engine publishes its queues by class; a front end refuses low-priority work at the edge while
    more urgent work waits there (SHED_QUEUE_DEPTH), whatever its own event loop's lag."""
    env = {
        "SERVED_MODELS": "gpt,bert-classifier",
        "MAX_RUNNING_SEQUENCES": "1",
        "SHED_QUEUE_DEPTH": "3",
        "SHED_LAG_MS": "0",
    }
    with _split(tiny_models, tmp_path / "service.log", **env) as server:
        stop = threading.Event()

        def generate() -> None:  # the tiny GPT ends within 64 tokens: each client asks again and again
            body = {"prompt": "KING:", "max_new_tokens": 59, "temperature": 0}
            while not stop.is_set():
                httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)

        busy = [threading.Thread(target=generate) for _ in range(8)]  # one runs, the others wait
        for t in busy:
            t.start()
        low = {"X-Request-Priority": "low"}
        shed = None
        deadline = time.monotonic() + 60  # the next heartbeats carry the queue (later on a loaded machine)
        while shed is None and time.monotonic() < deadline:
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, headers=low, timeout=60)
            if r.status_code == 429:
                shed = r
            time.sleep(0.05)
        normal = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, timeout=60)
        stop.set()
        for t in busy:
            t.join(timeout=120)
        assert shed is not None and shed.json()["error"]["type"] == "shed", shed
        assert "SHED_QUEUE_DEPTH" in shed.json()["error"]["message"]
        assert normal.status_code == 200  # normal priority is never shed
        # once the queue has emptied, low priority is served again
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, headers=low, timeout=60)
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
