"""The split's faults, each at its cause (FRONTENDS >= 1).

First the front end's engine client alone (``service/ipc/client.py``), over real ZeroMQ sockets, with the
test playing the engine's side of the protocol (``service/ipc/messages.py``): an answer never sent, an
answer that cannot be read, a request that cannot be sent, an engine that falls silent, and a stall of
the front end's own event loop. Then a real split service on the tiny models: malformed frames sent to
the engine, a front end stopped for 3 s, the engine stopped for 3 s under load, and high priority under
overload, which the engine's queue decides as one process does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from harness.ports import free_port
from harness.service_process import ServiceProcess
from service.errors import ModelUnavailableError
from service.ipc.channel import decode_batch, encode_batch, encode_broadcast, endpoints, ipc_folder
from service.ipc.client import DEADLINE_GRACE_S, EngineClient
from service.ipc.messages import (
    Abort,
    Asked,
    Batch,
    Heartbeat,
    Models,
    Reply,
    Submit,
)
from service.supervisor import ENGINE_IPC

NORMAL = Asked(priority=1, deadline=None)


class Engine:
    """The engine's side of the protocol, played by the test: a ROUTER and a PUB in the client's folder,
    heartbeats from a thread (``beating`` pauses them), and what the client sent, read on demand."""

    def __init__(self, folder: Path) -> None:
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.pub = self.context.socket(zmq.PUB)
        requests, broadcast = endpoints(folder)
        self.router.bind(requests)
        self.pub.bind(broadcast)
        self.beating = threading.Event()
        self.beating.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        self.identity = b""

    def _beat(self) -> None:
        models = encode_broadcast(Models(1, [], {}, [], [], [], {}))
        while not self._stop.is_set():
            if self.beating.is_set():
                with self._lock:
                    self.pub.send(encode_broadcast(Heartbeat(os.getpid(), 1.0, True, {})))
                    self.pub.send(models)
            time.sleep(0.1)

    def received(self, timeout_s: float = 10) -> list[tuple[Any, Any]]:
        """The envelopes of the next message from the client (with their payloads)."""
        if not self.router.poll(int(timeout_s * 1000)):
            raise TimeoutError("the client sent nothing")
        identity, *parts = self.router.recv_multipart()
        self.identity = identity
        return decode_batch(parts)

    def next_of(self, kind: type, timeout_s: float = 10) -> Any:
        """The next envelope of ``kind`` the client sends (others are skipped), with its payload."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for envelope, payload in self.received(deadline - time.monotonic()):
                if isinstance(envelope, kind):
                    return envelope, payload
        raise TimeoutError(f"no {kind.__name__} came")

    def send(self, frames: list[Any]) -> None:
        self.router.send_multipart([self.identity, *frames])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.router.close(linger=0)
        self.pub.close(linger=0)
        self.context.term()


def _with_client(scenario: Any) -> Any:
    """Run ``scenario(client, engine)`` on a fresh event loop with a started client that is up."""
    folder = ipc_folder()
    engine = Engine(folder)

    async def run() -> Any:
        client = EngineClient(folder, on_models=lambda _: None)
        await client.start()
        try:
            assert await client.wait_up(10), "the client never heard the engine"
            return await scenario(client, engine)
        finally:
            await client.stop()

    try:
        return asyncio.run(run())
    finally:
        engine.close()


# --- the client alone ------------------------------------------------------------------------------------


def test_an_answer_never_sent_fails_its_request_at_its_bound_and_the_engine_is_told_to_abort() -> None:
    async def scenario(client: EngineClient, engine: Engine) -> None:
        asked = Asked(priority=1, deadline=time.monotonic() + 0.2)
        started = time.monotonic()
        request = asyncio.ensure_future(client.submit("m", "v", ["x"], [1], asked))
        submit, _ = await asyncio.to_thread(engine.next_of, Submit)  # sent, and never answered
        with pytest.raises(ModelUnavailableError, match="no answer within"):
            await request
        assert time.monotonic() - started >= 0.2 + DEADLINE_GRACE_S - 0.05  # not before its bound
        abort, _ = await asyncio.to_thread(engine.next_of, Abort)
        assert abort.requests == [submit.id]
        assert client.up  # one lost answer is not the engine's death

    _with_client(scenario)


def test_an_answer_that_cannot_be_read_fails_its_request_and_the_loop_goes_on() -> None:
    async def scenario(client: EngineClient, engine: Engine) -> None:
        first = asyncio.ensure_future(client.submit("m", "v", ["a"], [1], NORMAL))
        second = asyncio.ensure_future(client.submit("m", "v", ["b"], [1], NORMAL))
        ids: list[int] = []
        while len(ids) < 2:
            for envelope, _ in await asyncio.to_thread(engine.received):
                if isinstance(envelope, Submit):
                    ids.append(envelope.id)
        engine.send([b"\xc1 not msgpack"])  # nothing readable at all: logged, nothing named
        head = msgspec.msgpack.encode(Batch([Reply(ids[0], True, payload=0)]))
        engine.send([head, b"\xc1 not msgpack"])  # a reply whose payload cannot be decoded
        with pytest.raises(ModelUnavailableError, match="could not be read"):
            await first
        engine.send(encode_batch([Reply(ids[1], True, payload=0)], [["answered"]]))
        assert await second == ["answered"]
        assert client.up and not client.broken

    _with_client(scenario)


def test_a_request_that_cannot_be_sent_fails_alone() -> None:
    async def scenario(client: EngineClient, engine: Engine) -> None:
        undeclared = asyncio.ensure_future(client.submit("m", "v", [lambda: None], [1], NORMAL))
        fine = asyncio.ensure_future(client.submit("m", "v", ["fine"], [1], NORMAL))
        with pytest.raises(ModelUnavailableError, match="could not be sent"):
            await undeclared
        submit, payload = await asyncio.to_thread(engine.next_of, Submit)
        assert payload.value(list[str]) == ["fine"]  # sent on its own, the batch's other request
        engine.send(encode_batch([Reply(submit.id, True, payload=0)], [["ok"]]))
        assert await fine == ["ok"]

    _with_client(scenario)


def test_an_engine_that_falls_silent_fails_what_waits_and_is_told_to_abort_it() -> None:
    async def scenario(client: EngineClient, engine: Engine) -> None:
        request = asyncio.ensure_future(client.submit("m", "v", ["x"], [1], NORMAL))
        submit, _ = await asyncio.to_thread(engine.next_of, Submit)
        engine.beating.clear()  # silent from now
        with pytest.raises(ModelUnavailableError, match="restarting"):
            await request
        assert not client.up
        abort, _ = await asyncio.to_thread(engine.next_of, Abort)
        assert submit.id in abort.requests  # the engine, if it still reads, drops the orphan

    _with_client(scenario)


def test_a_stall_of_the_front_ends_own_loop_is_not_the_engines_death() -> None:
    async def scenario(client: EngineClient, engine: Engine) -> None:
        request = asyncio.ensure_future(client.submit("m", "v", ["x"], [1], NORMAL))
        submit, _ = await asyncio.to_thread(engine.next_of, Submit)
        time.sleep(3)  # a blocking callback: the loop stalls while the engine's heartbeats keep coming
        await asyncio.sleep(1.5)  # the watcher's next ticks, after the stall
        assert client.up, "a stall of this loop was read as the engine's silence"
        assert not request.done()  # still waiting for its answer, which comes
        engine.send(encode_batch([Reply(submit.id, True, payload=0)], [["late"]]))
        assert await request == ["late"]

    _with_client(scenario)


# --- a real split service ----------------------------------------------------------------------------------


def _children(pid: int) -> list[tuple[int, str]]:
    table = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            table.append((int(entry.name), int(stat.rsplit(")", 1)[1].split()[1]), cmdline))
    found, frontier = [], {pid}
    while frontier:
        found += [(p, c) for p, parent, c in table if parent in frontier]
        frontier = {p for p, parent, _ in table if parent in frontier}
    return found


@pytest.fixture(scope="module")
def split(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    settings = {
        "MODEL_REPOSITORY": str(tiny_models),
        "SERVED_MODELS": "gpt,bert-classifier",
        "FRONTENDS": "1",
        "CACHE_ENABLED": "false",
        "GRPC_PORT": str(free_port()),
        "ACCESS_LOG": "false",
        "MAX_RUNNING_SEQUENCES": "1",
        "MAX_QUEUE_SIZE": "3",
        "MAX_ITEMS": "3",
        "SHED_LAG_MS": "0",  # low priority is refused by the engine's queue here, not shed by a lagging loop
    }
    log = tmp_path_factory.mktemp("split-faults") / "service.log"
    with ServiceProcess(settings, log_path=log, stop_grace_s=20) as server:
        yield server


def _processes(server: ServiceProcess) -> tuple[int, int]:
    """The engine's pid and the front end's."""
    assert server.proc is not None
    children = _children(server.proc.pid)
    engines = [p for p, cmd in children if "service.engine_host" in cmd]
    frontends = [p for p, cmd in children if p not in engines and "spawn_main" in cmd]
    assert len(engines) == 1 and len(frontends) == 1, children
    return engines[0], frontends[0]


def _classify(server: ServiceProcess, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, headers=headers, timeout=60)


def test_malformed_frames_fail_what_they_name_and_the_engine_serves_on(split: ServiceProcess) -> None:
    engine, _ = _processes(split)
    environ = dict(
        line.split("=", 1) for line in Path(f"/proc/{engine}/environ").read_text().split("\0") if "=" in line
    )
    requests, _ = endpoints(Path(environ[ENGINE_IPC]))
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(requests)
    try:
        dealer.send_multipart([b"\xc1 not msgpack"])
        dealer.send_multipart([b"\x92\x01"])  # MessagePack, but no Batch
        head = msgspec.msgpack.encode(Batch([Submit(7, "bert-classifier", "v", [1], NORMAL, payload=0)]))
        dealer.send_multipart([head, b"\xc1 not msgpack"])
        assert dealer.poll(30_000), "the engine never answered the request it could read"
        [(reply, payload)] = decode_batch(dealer.recv_multipart())
        assert isinstance(reply, Reply) and reply.id == 7 and not reply.ok
        assert "could not be decoded" in str(payload.error())
    finally:
        dealer.close(linger=0)
        context.term()
    assert _classify(split).status_code == 200
    assert httpx.get(f"{split.url}/health/ready", timeout=10).status_code == 200


def test_a_front_end_stopped_for_3_s_does_not_read_its_stall_as_the_engines_death(
    split: ServiceProcess,
) -> None:
    _, frontend = _processes(split)
    assert _classify(split).status_code == 200
    os.kill(frontend, signal.SIGSTOP)
    time.sleep(3)
    os.kill(frontend, signal.SIGCONT)
    answers = [_classify(split).status_code for _ in range(10)]
    time.sleep(1)  # the watcher's ticks after the stall
    answers += [_classify(split).status_code for _ in range(5)]
    assert answers == [200] * 15, answers
    assert "stopped answering" not in split.log()


def test_high_priority_under_overload_displaces_low_through_the_split(split: ServiceProcess) -> None:
    """One sequence decodes at a time and three may wait: low-priority clients keep that queue full. Each
    high-priority request is admitted in a low one's place, as in one process (the front end refused by
    the depth it last heard, before: 4 of 10 were 429)."""
    stop = threading.Event()
    low_statuses: list[int] = []

    def low() -> None:
        body = {"prompt": "KING:", "max_new_tokens": 59, "temperature": 0, "priority": "low"}
        while not stop.is_set():
            low_statuses.append(httpx.post(f"{split.url}/v1/generate", json=body, timeout=120).status_code)

    clients = [threading.Thread(target=low) for _ in range(6)]
    for client in clients:
        client.start()
    try:
        deadline = time.monotonic() + 60
        while 429 not in low_statuses and time.monotonic() < deadline:  # the queue is full
            time.sleep(0.05)
        assert 429 in low_statuses, "the low-priority clients never filled the queue"
        body = {"prompt": "KING:", "max_new_tokens": 4, "temperature": 0, "priority": "high"}
        high = [httpx.post(f"{split.url}/v1/generate", json=body, timeout=120) for _ in range(10)]
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=120)
    assert [r.status_code for r in high] == [200] * 10, [r.text for r in high if r.status_code != 200]
    assert low_statuses.count(200) >= 1  # low priority still progresses


def test_the_engine_stopped_for_3_s_under_load_leaves_no_request_unanswered(split: ServiceProcess) -> None:
    engine, _ = _processes(split)
    stop = threading.Event()
    outcomes: list[str] = []

    def ask() -> None:
        while not stop.is_set():
            try:
                outcomes.append(str(_classify(split).status_code))
            except httpx.HTTPError as exc:  # a request that hung (60 s) or a connection cut
                outcomes.append(type(exc).__name__)

    clients = [threading.Thread(target=ask) for _ in range(8)]
    for client in clients:
        client.start()
    time.sleep(1)
    os.kill(engine, signal.SIGSTOP)
    time.sleep(3)
    os.kill(engine, signal.SIGCONT)
    resumed = len(outcomes)
    deadline = time.monotonic() + 30
    while outcomes[resumed:].count("200") < 20 and time.monotonic() < deadline:  # until it serves again
        time.sleep(0.1)
    stop.set()
    for client in clients:
        client.join(timeout=90)
    assert set(outcomes) <= {"200", "429", "503"}, sorted(set(outcomes))  # an answer each, none hung
    assert outcomes[resumed:].count("200") >= 20, outcomes[resumed:][-20:]


def test_a_child_started_from_a_thread_sets_its_own_death_signal_and_exits_if_its_parent_is_gone() -> None:
    """The engine is restarted from the supervisor's watcher thread, so without ``preexec_fn`` (not safe
    with threads): it sets PR_SET_PDEATHSIG itself, and exits at once if the pid that started it is no
    longer its parent (the parent died before the call: no signal would ever come)."""
    script = "import sys; from service.process import die_with_parent; die_with_parent(parent=int(sys.argv[1])); print('serving')"
    mine = subprocess.run(
        [sys.executable, "-c", script, str(os.getpid())], capture_output=True, text=True, timeout=60
    )
    assert mine.returncode == 0 and mine.stdout.strip() == "serving", mine.stderr
    orphan = subprocess.run([sys.executable, "-c", script, "1"], capture_output=True, text=True, timeout=60)
    assert orphan.returncode == 0 and orphan.stdout == "", orphan.stderr  # gone before doing anything
