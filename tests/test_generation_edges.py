"""Generation against hostile requests (issue 60, part B), through a real server on loopback with the
real clients (``openai``, httpx): a request larger than the queue can ever hold, one request's many
sequences beside a small one, chat templates that recurse, range too far or run slow, and aging under a
key's ceiling. Order is asserted, never a duration."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from servers import LiveServer

from service.engine.scheduling import HIGH, LOW, NORMAL, PriorityQueue
from service.pipelines.chat_template import ChatTemplate, ChatTemplateError
from service.settings import Settings

KEYS = {"low": "key-of-a-low-tenant", "team": "key-of-a-normal-tenant"}
KEYS_TOML = "".join(
    f'[[keys]]\nid = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\npriority = "{cls}"\n'
    for (name, key), cls in zip(KEYS.items(), ("low", "normal"), strict=True)
)
# One template, three ways to misbehave, chosen by a variable a request sets (chat_template_kwargs).
TEMPLATE = """{% macro deeper(n) %}{{ deeper(n + 1) }}{% endmacro %}
{% if mode == "recurse" %}{{ deeper(0) }}
{% elif mode == "range" %}{% for i in range(10**8) %}x{% endfor %}
{% elif mode == "slow" %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}
{% elif mode == "long" %}{% for i in range(1000) %}{{ messages[0].content }}{% endfor %}
{% endif %}
{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"""
MESSAGES = [{"role": "user", "content": "Now is the winter"}]
RUNNING = 4  # MAX_RUNNING_SEQUENCES
QUEUE = 64  # MAX_QUEUE_SIZE


@pytest.fixture(scope="module")
def api(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("edges")
    (folder / "keys.toml").write_text(KEYS_TOML)
    (folder / "chat.jinja").write_text(TEMPLATE)
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["gpt"],
        API_KEYS_FILE=folder / "keys.toml",
        CACHE_ENABLED=False,
        SHED_LAG_MS=0,  # never shed: what the tests send reaches the queue whatever the machine's load
        MAX_RUNNING_SEQUENCES=RUNNING,
        MAX_QUEUE_SIZE=QUEUE,
        MAX_ITEMS=8,
        MAX_NEW_TOKENS=64,
        MAX_TOTAL_NEW_TOKENS=1024,
        CHAT_TEMPLATE=folder / "chat.jinja",
        CHAT_TEMPLATE_TIMEOUT_S=3,
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=KEYS["team"], max_retries=0)


def _param(exc: openai.APIStatusError) -> str | None:
    body = exc.body
    return body.get("param") if isinstance(body, dict) else None


# --- 1. a request the queue can never hold -----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"n": 16}, "n"), ({"n": 2, "best_of": 16}, "best_of")],
)
def test_more_sequences_than_the_queue_holds_is_a_400_naming_the_field(
    client: openai.OpenAI, extra: dict[str, Any], field: str
) -> None:
    prompts = [f"prompt {i}" for i in range(8)]  # 8 x 16 = 128 sequences, the queue holds 64
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="gpt", prompt=prompts, max_tokens=1, **extra)
    assert _param(caught.value) == field, caught.value.body
    assert "MAX_QUEUE_SIZE" in str(caught.value.body)
    assert caught.value.response.headers.get("retry-after") is None  # not an invitation to retry
    fits = client.completions.create(model="gpt", prompt=prompts, max_tokens=1, n=8)  # exactly 64: served
    assert len(fits.choices) == 64


def test_n_best_of_and_max_tokens_together_are_bounded(client: openai.OpenAI) -> None:
    # 2 prompts x best_of 16 x 64 tokens = 2,048 over MAX_TOTAL_NEW_TOKENS 1,024
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="gpt", prompt=["a", "b"], max_tokens=64, n=1, best_of=16)
    assert _param(caught.value) == "max_tokens" and "MAX_TOTAL_NEW_TOKENS" in str(caught.value.body)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt", messages=MESSAGES, max_completion_tokens=64, n=17)  # type: ignore[arg-type]
    assert _param(caught.value) == "max_completion_tokens", caught.value.body


# --- 2. one request's many sequences share the batch ----------------------------------------------------


def test_a_small_request_after_a_big_one_finishes_before_the_big_ones_last_sequence(
    api: LiveServer, client: openai.OpenAI
) -> None:
    engine = api.pipeline("gpt").engine
    finished: list[str] = []

    def big() -> None:  # 16 sequences of 48 tokens each: four rounds of the 4-row batch, first in first out
        client.completions.create(
            model="gpt",
            prompt="KING HENRY:",
            max_tokens=48,
            n=16,
            seed=1,
            extra_body={"min_tokens": 48},  # each runs its full length, none ends early
        )
        finished.append("big")

    def small() -> None:
        done = client.completions.create(
            model="gpt", prompt="Now", max_tokens=8, extra_body={"min_tokens": 8}
        )
        assert done.usage is not None and done.usage.completion_tokens == 8
        finished.append("small")

    busy = api.occupy("gpt", 4.0)  # nothing computes until both are queued
    with ThreadPoolExecutor(2) as pool:
        work = [pool.submit(big)]
        _until(lambda: engine.waiting + engine.running == 16, busy)  # some taken, the rest waiting
        work.append(pool.submit(small))
        _until(lambda: engine.waiting + engine.running == 17, busy)  # the small one queued behind
        for f in work:
            f.result(timeout=120)
    assert finished == ["small", "big"]


def _until(condition: Any, busy: Future[Any]) -> None:
    """Wait for ``condition`` while the model's compute thread is still held (``LiveServer.occupy``)."""
    while not condition():
        assert not busy.done(), "the compute thread was let go before the requests were queued"
        time.sleep(0.005)


# --- 3. chat templates are bounded and off the event loop ------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "says"),
    [("recurse", "recursed"), ("range", "range"), ("long", "MAX_TEXT_CHARS")],
)
def test_a_template_that_recurses_ranges_too_far_or_writes_too_much_is_a_400_naming_messages(
    client: openai.OpenAI, mode: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt",
            messages=[{"role": "user", "content": "x" * 100}],
            max_completion_tokens=2,
            extra_body={"chat_template_kwargs": {"mode": mode}},
        )
    assert _param(caught.value) == "messages", caught.value.body
    assert says in str(caught.value.body)
    fine = client.chat.completions.create(model="gpt", messages=MESSAGES, max_completion_tokens=2)  # type: ignore[arg-type]
    assert fine.choices[0].message.role == "assistant"  # the server serves on


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('{{ "x" * 10**9 }}', "repeats"),
        ('{{ "x" | center(100000000) }}', "do_center"),  # a filter of constants: not run as it compiles
        ('{{ "x".ljust(10**9) }}', "ljust"),
        ('{{ "%0100000000d" % 1 }}', "width"),
        ('{{ "{:>100000000}".format(1) }}', "width"),
        ("{{ 10 ** 1000000 }}", "power"),
        ('{% for i in range(10000) %}{{ "words " }}{% endfor %}', "4096 characters"),
    ],
)
def test_a_template_that_would_make_a_huge_value_is_stopped_before_it(source: str, says: str) -> None:
    template = ChatTemplate(source, {})  # compiling runs none of it
    with pytest.raises(ChatTemplateError) as caught:
        template.render(MESSAGES)
    assert caught.value.field == "messages" and says in caught.value.message, caught.value.message
    assert ChatTemplate('{{ "%s-%d" % ("a", 3) }}{{ "{}!".format("b") }}', {}).render(MESSAGES) == "a-3b!"


def test_a_slow_template_is_stopped_and_the_event_loop_answers_meanwhile(
    api: LiveServer, client: openai.OpenAI
) -> None:
    order: list[str] = []
    lock = threading.Lock()

    def slow() -> openai.BadRequestError:
        try:
            client.chat.completions.create(
                model="gpt",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_completion_tokens=2,
                extra_body={"chat_template_kwargs": {"mode": "slow"}},
            )
        except openai.BadRequestError as exc:
            with lock:
                order.append("template")
            return exc
        raise AssertionError("a template that never ends rendered")

    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=api.url, timeout=30) as http:
        render: Future[openai.BadRequestError] = pool.submit(slow)
        time.sleep(0.5)  # the render (bounded at 3 s) is under way
        for _ in range(5):
            assert http.get("/health/live").status_code == 200
            with lock:
                order.append("live")
        refused = render.result(timeout=60)
    assert order == ["live"] * 5 + ["template"], order
    assert _param(refused) == "messages" and "longer than 3 s" in str(refused.body)


# --- 4. aging stops at a key's ceiling ------------------------------------------------------------------


def test_aging_never_lifts_an_item_above_its_ceiling() -> None:
    queue: PriorityQueue[tuple[str, int, float, int]] = PriorityQueue(
        lambda item: (item[1], item[2]), aging_s=5.0, ceiling=lambda item: item[3]
    )
    queue.append(("capped low", LOW, 0.0, LOW))  # a key whose max_priority is low
    queue.append(("free low", LOW, 0.0, HIGH))  # a key without a ceiling
    queue.append(("normal", NORMAL, 30.0, HIGH))
    # at 31 s both lows waited six periods: the free one rose to high, the capped one stayed low
    assert [item[0] for item in queue.in_order(3, now=31.0)] == ["free low", "normal", "capped low"]
    assert queue.popleft(now=31.0)[0] == "free low"
    assert queue.popleft(now=31.0)[0] == "normal"


def test_a_low_tenant_waiting_long_is_still_served_after_a_normal_one(api: LiveServer) -> None:
    """The low tenant asks ``high`` (lowered to its ceiling, low) and waits many aging periods; a normal
    request sent later still takes the first place that frees. Each runs 20 tokens, so the one that
    waits for the other's place finishes 20 steps after it (the fillers run 64, so no other place frees
    meanwhile)."""
    engine = api.pipeline("gpt").engine
    aging = engine._waiting._aging_s
    engine._waiting._aging_s = 0.1  # many periods within the test, not 5 s each
    finished: list[str] = []
    lock = threading.Lock()
    length = {"max_tokens": 20, "min_tokens": 20}

    def send(label: str, key: str, body: dict[str, Any]) -> None:
        r = httpx.post(
            f"{api.url}/v1/completions",
            json={"model": "gpt", "prompt": label, **body},
            headers={"Authorization": f"Bearer {KEYS[key]}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        with lock:
            finished.append(label)

    busy = api.occupy("gpt", 6.0)  # nothing computes until every request is queued
    try:
        with ThreadPoolExecutor(RUNNING + 2) as pool:
            # the batch full; the short filler, prefilled first, frees its place well before the others
            work = [pool.submit(send, "short filler", "team", {"max_tokens": 8, "min_tokens": 8})]
            _until(lambda: engine.running == 1, busy)
            work += [
                pool.submit(send, f"filler {i}", "team", {"max_tokens": 64, "min_tokens": 64})
                for i in range(RUNNING - 1)
            ]
            _until(lambda: engine.waiting == RUNNING - 1, busy)
            work.append(pool.submit(send, "low", "low", {**length, "priority": -1}))  # vLLM's high
            _until(lambda: engine.waiting == RUNNING, busy)
            time.sleep(0.4)  # the low one waits four aging periods more than the normal one will
            work.append(pool.submit(send, "normal", "team", length))
            _until(lambda: engine.waiting == RUNNING + 1, busy)
            for f in work:
                f.result(timeout=120)
    finally:
        engine._waiting._aging_s = aging
    assert finished.index("short filler") < finished.index("normal") < finished.index("low"), finished
