"""The OpenAI-compatible routes, driven by the official ``openai`` client with its default settings
against a real server on loopback (tiny models). No mocks."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from servers import LiveServer

from service.settings import Settings

PROMPT = "KING HENRY:\nNow is"


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        CACHE_ENABLED=False,
        MAX_ITEMS=8,
        MAX_NEW_TOKENS=64,
        MAX_TOTAL_NEW_TOKENS=256,
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0)


@pytest.fixture(scope="module")
def http(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


def test_models_list_in_openai_shape_with_our_fields(client: openai.OpenAI, http: httpx.Client) -> None:
    models = {m.id: m for m in client.models.list()}
    assert {"gpt", "translator", "vit"} <= set(models)
    gpt = models["gpt"]
    assert gpt.object == "model" and gpt.owned_by and gpt.created > 0
    raw = http.get("/v1/models").json()
    assert raw["object"] == "list"
    assert raw["models"] == raw["data"]  # the deprecated alias, for one release
    entry = next(m for m in raw["data"] if m["id"] == "gpt")
    assert entry["task"] == "text-generation" and entry["name"] == "gpt"
    assert entry["execution_provider"].endswith("ExecutionProvider")
    assert "bits_per_char" in entry["validation"]["validation"]  # split -> figures
    assert raw["limits"]["max_items"] == 8 and raw["refused"] == []


def test_greedy_completion_equals_generate(client: openai.OpenAI, http: httpx.Client) -> None:
    done = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=12, temperature=0)
    assert done.object == "text_completion" and done.id.startswith("cmpl-") and done.model == "gpt"
    (choice,) = done.choices
    ours = http.post("/v1/generate", json={"prompt": PROMPT, "max_new_tokens": 12, "temperature": 0}).json()
    result = ours["results"][0]
    assert choice.text == result["text"]
    assert choice.finish_reason == {"eos": "stop"}.get(result["finish_reason"], result["finish_reason"])
    assert done.usage is not None
    assert done.usage.prompt_tokens == result["prompt_tokens"]
    assert done.usage.completion_tokens == result["completion_tokens"]
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    done = client.completions.create(model="gpt", prompt=PROMPT, temperature=0)
    assert done.usage is not None
    assert done.usage.completion_tokens == 16 or done.choices[0].finish_reason == "stop"


def test_stream_concatenates_to_the_non_streamed_text(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "prompt": PROMPT, "max_tokens": 20, "temperature": 0}
    plain = client.completions.create(**args).choices[0]  # type: ignore[call-overload]
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})  # type: ignore[call-overload]
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == plain.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(texts) - 1  # one chunk per token, then the finish


def test_stream_raw_sse_has_no_event_lines_and_ends_done(http: httpx.Client) -> None:
    body = {"model": "gpt", "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_n_with_seed_is_reproducible_and_choice_i_uses_seed_plus_i(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "prompt": [PROMPT, "ROMEO:"], "max_tokens": 10, "temperature": 1.0}
    first = client.completions.create(**args, n=3, seed=7)  # type: ignore[call-overload]
    again = client.completions.create(**args, n=3, seed=7)  # type: ignore[call-overload]
    assert [c.index for c in first.choices] == list(range(6))  # prompt index x n + choice
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices[:3]}) > 1  # different seeds per choice
    one = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=10, temperature=1.0, seed=8)
    assert one.choices[0].text == first.choices[1].text  # choice 1 of seed 7 == seed 8 alone
    streamed = client.completions.create(**args, n=3, seed=7, stream=True)  # type: ignore[call-overload]
    texts = [""] * 6
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in first.choices]


def test_stop_string(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "prompt": PROMPT, "max_tokens": 30, "seed": 3}  # sampled: the tiny GPT's greedy
    free = client.completions.create(**args).choices[0]  # type: ignore[call-overload]  # text is blank lines
    stop = free.text[8:11]
    assert len(stop) == 3, free.text
    cut = client.completions.create(**args, stop=[stop, "never-seen"])  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == free.text[: free.text.index(stop)]


def test_logprobs_and_echo(client: openai.OpenAI) -> None:
    done = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    choice = done.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value is not None and value <= 0
        assert top is not None and 3 <= len(top) <= 4  # the 3 best, and the sampled token
        assert math.isclose(max(top.values()), value, abs_tol=1e-6)  # greedy: the sampled token is the best
        assert top[token] == pytest.approx(value)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0

    echoed = client.completions.create(
        model="gpt", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1, echo=True
    ).choices[0]
    assert echoed.text == PROMPT + choice.text
    elp = echoed.logprobs
    assert elp is not None and elp.token_logprobs is not None and elp.tokens is not None
    assert echoed.logprobs is not None
    prompt_tokens = done.usage.prompt_tokens if done.usage else 0
    assert len(elp.tokens) == prompt_tokens + 6
    assert elp.token_logprobs[0] is None and all(v is not None for v in elp.token_logprobs[1:])
    assert elp.token_logprobs[prompt_tokens:] == pytest.approx(lp.token_logprobs)


def test_penalties_are_accepted_and_change_greedy_repetition(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "prompt": "the the the", "max_tokens": 24, "temperature": 0}
    plain = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    zero = client.completions.create(**args, presence_penalty=0, frequency_penalty=0).choices[0].text  # type: ignore[call-overload]
    assert zero == plain
    vllm = client.completions.create(**args, extra_body={"top_k": 1, "repetition_penalty": 1.0})  # type: ignore[call-overload]
    assert vllm.choices[0].text == plain


@pytest.mark.parametrize(
    ("kwargs", "status", "param"),
    [
        ({"model": "no-such-model"}, 404, "model"),
        ({"temperature": 5}, 400, "temperature"),
        ({"max_tokens": 65}, 400, "max_tokens"),  # over MAX_NEW_TOKENS
        ({"max_tokens": 64, "n": 5}, 400, "max_tokens"),  # 320 > MAX_TOTAL_NEW_TOKENS
        ({"prompt": ["a"] * 9}, 400, "prompt"),  # over MAX_ITEMS
        ({"suffix": "x"}, 400, "suffix"),
        ({"model": "translator"}, 400, "model"),  # a model of another task
        ({"extra_body": {"nonsense": 1}}, 400, "nonsense"),
    ],
)
def test_errors_are_openai_status_errors(
    client: openai.OpenAI, kwargs: dict[str, object], status: int, param: str
) -> None:
    args: dict[str, object] = {"model": "gpt", "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**args)  # type: ignore[call-overload]
    error = caught.value
    assert error.status_code == status
    assert isinstance(error, openai.NotFoundError if status == 404 else openai.BadRequestError)
    assert isinstance(error.body, dict)
    assert set(error.body) == {"message", "type", "param", "code"}  # the client hands over body["error"]
    assert error.body["param"] == param and error.body["type"] == "invalid_request_error"


def test_chat_completions_refused_no_chat_template(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_openapi_documents_the_routes(http: httpx.Client) -> None:
    paths = http.get("/schema/openapi.json").json()["paths"]
    completions = paths["/v1/completions"]["post"]
    assert {"200", "400", "404", "413", "429", "503"} <= set(completions["responses"])
    assert "text/event-stream" in completions["responses"]["200"]["content"]
    assert "/v1/chat/completions" in paths and "/v1/models" in paths


def test_api_keys_work_with_the_client(tiny_models: Path) -> None:
    # The client sends its api_key as "Authorization: Bearer KEY": API_KEYS applies, in OpenAI's error shape.
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models, API_KEYS=["sk-right"])) as server:
        wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.completions.create(model="gpt", prompt=PROMPT, max_tokens=2)
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "unauthorized"
        right = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-right", max_retries=0)
        assert right.completions.create(model="gpt", prompt=PROMPT, max_tokens=2).choices[0].index == 0


def test_logit_bias_min_tokens_and_best_of(client: openai.OpenAI, http: httpx.Client) -> None:
    args = {"model": "gpt", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    plain = client.completions.create(**args).choices[0]  # type: ignore[call-overload]
    eos_first = client.completions.create(**args, logit_bias={"0": 100})  # type: ignore[call-overload]
    assert eos_first.choices[0].text == "" and eos_first.choices[0].finish_reason == "stop"
    held = client.completions.create(**args, logit_bias={"0": 100}, extra_body={"min_tokens": 3})  # type: ignore[call-overload]
    assert held.usage is not None and held.usage.completion_tokens == 4  # three tokens, then the end of text
    assert held.choices[0].finish_reason == "stop" and plain.text.startswith(held.choices[0].text)
    # best_of: 5 seeded sequences, the 2 of highest cumulative logprob, best first; usage counts all 5
    sampled = {"model": "gpt", "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 11}
    best = client.completions.create(**sampled, n=2, best_of=5, logprobs=0)  # type: ignore[call-overload]
    every = client.completions.create(**sampled, n=5, logprobs=0)  # type: ignore[call-overload]
    scores = [sum(c.logprobs.token_logprobs) for c in every.choices]  # type: ignore[union-attr,arg-type]
    ranked = sorted(range(5), key=lambda i: -scores[i])[:2]
    assert [c.text for c in best.choices] == [every.choices[i].text for i in ranked]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage is not None and every.usage is not None
    assert best.usage.completion_tokens == every.usage.completion_tokens
    quiet = client.completions.create(**sampled, n=2, best_of=5)  # type: ignore[call-overload]
    assert [c.text for c in quiet.choices] == [c.text for c in best.choices]
    assert all(c.logprobs is None for c in quiet.choices)
    # REST takes the same two fields
    rest = http.post(
        "/v1/generate",
        json={
            "prompt": PROMPT,
            "max_new_tokens": 8,
            "temperature": 0,
            "logit_bias": {"0": 100},
            "min_tokens": 3,
        },
    ).json()["results"][0]
    assert rest["text"] == held.choices[0].text and rest["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logit_bias": {"400": 1}}, "logit_bias"),  # the tiny GPT has 400 tokens
        ({"extra_body": {"min_tokens": 5}}, "min_tokens"),  # over max_tokens 4
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 2, "stream": True}, "best_of"),
    ],
)
def test_bad_generation_extras_are_400_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="gpt", prompt=PROMPT, max_tokens=4, **kwargs)  # type: ignore[call-overload]
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param
