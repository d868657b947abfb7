"""Structured output against hostile constraints, through the real server and clients (``openai``, httpx
for REST and v2): a grammar deep enough to overflow llguidance's stack is a 400 and the server goes on;
``logit_bias`` keys by one ASCII rule; one bound on choices at every door; ``stop`` only for a text the
grammar accepts whole; compiling never stalls the decoding loop; nothing of a constraint in the log.
Assertions are on statuses, fields, texts, finish reasons and the order of events, never on durations."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from servers import LiveServer

from service.engine.continuous_batching import GenerationEngine
from service.engine.generation_contract import GenerationRequest
from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import SamplingParams
from service.engine.structured_output import MAX_CHOICES, MAX_GRAMMAR_RULES, StructuredOutput
from service.settings import Settings

pytestmark = pytest.mark.timeout(600)


def chain(rules: int) -> str:
    """A Lark grammar of ``rules`` rules, each the next one: as deep as it is long."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules - 1)) + f'r{rules - 1}: "a"\n'


def ref_chain(levels: int) -> str:
    """A JSON schema of ``levels`` definitions, each an object holding the next (about 9 KB of
    llguidance's stack per level: 900 of them overflow an 8 MiB thread)."""
    defs: dict[str, object] = {
        f"d{i}": {"properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["a"]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"enum": ["x"]}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs}, separators=(",", ":"))


@pytest.fixture(scope="module")
def api(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    template = tmp_path_factory.mktemp("chat") / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_NEW_TOKENS=64, CHAT_TEMPLATE=template
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0)


def refused(call: object, **kwargs: object) -> dict[str, object]:
    with pytest.raises(openai.BadRequestError) as caught:
        call(**kwargs)  # type: ignore[operator]
    body = caught.value.body
    assert isinstance(body, dict), body
    return body


def _is_json(text: str) -> bool:
    """Whether ``text`` is one JSON value: ``null`` too, which ref_chain's schemas accept (no ``type``)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_grammar_deep_enough_to_crash_the_compiler_is_a_400_and_the_server_goes_on(
    client: openai.OpenAI,
) -> None:
    deep = chain(3000)  # without the bounds: SIGSEGV in llguidance, this whole process gone
    body = refused(
        client.completions.create, model="gpt", prompt="a", max_tokens=4, extra_body={"guided_grammar": deep}
    )
    assert body["param"] == "guided_grammar" and str(MAX_GRAMMAR_RULES) in str(body["message"]), body
    messages = [{"role": "user", "content": "hi"}]
    body = refused(
        client.chat.completions.create,
        model="gpt",
        messages=messages,
        max_tokens=4,
        extra_body={"structured_outputs": {"grammar": deep}},
    )
    assert body["param"] == "structured_outputs.grammar", body
    after = client.completions.create(model="gpt", prompt="ROMEO:", max_tokens=4)
    assert after.choices[0].text and after.choices[0].finish_reason == "length"
    # As deep as the bounds let through: compiled on a deep-stack thread, it generates.
    ok = client.completions.create(
        model="gpt", prompt="a", max_tokens=4, extra_body={"guided_grammar": chain(MAX_GRAMMAR_RULES - 1)}
    )
    assert ok.choices[0].text == "a" and ok.choices[0].finish_reason == "stop"
    schema = ref_chain(900)  # crashes an 8 MiB thread; within MAX_SPEC_CHARS
    deep_json = client.completions.create(
        model="gpt", prompt="a", max_tokens=8, extra_body={"guided_json": schema}
    )
    (deep_choice,) = deep_json.choices
    assert deep_choice.text and (deep_choice.finish_reason == "length" or _is_json(deep_choice.text))


BAD_KEYS = ["²", "١٢", "--5", "9" * 5000, "٣", "𝟓", "-1", "1.0", ""]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_logit_bias_keys_are_ascii_token_ids_on_every_door(
    api: LiveServer, client: openai.OpenAI, key: str
) -> None:
    body = refused(client.completions.create, model="gpt", prompt="a", max_tokens=2, logit_bias={key: 1})
    assert body["param"] == "logit_bias" and "ASCII digits" in str(body["message"]), body
    assert "invalid literal" not in str(body["message"])
    chat = refused(
        client.chat.completions.create,
        model="gpt",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        logit_bias={key: 1},
    )
    assert chat["param"] == "logit_bias" and "ASCII digits" in str(chat["message"]), chat
    rest = httpx.post(
        f"{api.url}/v1/generate",
        json={"prompt": "a", "max_new_tokens": 2, "logit_bias": {key: 1}},
        timeout=60,
    )
    assert rest.status_code in (400, 422) and rest.json()["error"]["field"] == "logit_bias", rest.text
    v2 = httpx.post(
        f"{api.url}/v2/models/gpt/generate",
        json={"text_input": "a", "parameters": {"max_tokens": 2, "logit_bias": json.dumps({key: 1})}},
        timeout=60,
    )
    assert v2.status_code == 400 and "logit_bias" in v2.text, v2.text  # v2 takes no logit_bias
    good = client.completions.create(
        model="gpt", prompt="a", max_tokens=2, logit_bias={"5": 100}, temperature=0
    )
    assert good.choices[0].finish_reason == "length"


def test_one_bound_on_choices_at_every_door(api: LiveServer, client: openai.OpenAI) -> None:
    many = [f"c{i}" for i in range(MAX_CHOICES + 1)]
    body = refused(
        client.completions.create, model="gpt", prompt="a", max_tokens=2, extra_body={"guided_choice": many}
    )
    assert body["param"] == "guided_choice", body
    rest = httpx.post(
        f"{api.url}/v1/generate", json={"prompt": "a", "structured_outputs": {"choice": many}}, timeout=60
    )
    assert rest.status_code == 422 and rest.json()["error"]["field"] == "structured_outputs.choice"
    for choices in (many, [f"c{i}" for i in range(100_000)]):
        v2 = httpx.post(
            f"{api.url}/v2/models/gpt/infer",
            json={
                "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                "parameters": {"guided_choice": json.dumps(choices)},
            },
            timeout=60,
        )
        assert v2.status_code == 400 and "guided_choice" in v2.text and f"at most {MAX_CHOICES}" in v2.text, (
            v2.text
        )
    at_bound = client.completions.create(
        model="gpt", prompt="a", max_tokens=8, extra_body={"guided_choice": many[:MAX_CHOICES]}
    )
    assert at_bound.choices[0].text in many


UNSATISFIABLE = [
    ({"guided_regex": "a{1000000}"}, "guided_regex"),
    ({"guided_regex": "a{4294967295}"}, "guided_regex"),
    (
        {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}},
        "guided_json",
    ),
    (
        {
            "guided_json": {
                "$ref": "#/$defs/x",
                "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}},
            }
        },
        "guided_json",
    ),
    ({"structured_outputs": {"grammar": "start: a\na: a"}}, "structured_outputs.grammar"),
]


@pytest.mark.parametrize(("body", "param"), UNSATISFIABLE)
def test_a_constraint_no_text_meets_is_refused_up_front(
    client: openai.OpenAI, body: dict[str, object], param: str
) -> None:
    answer = refused(client.completions.create, model="gpt", prompt="a", max_tokens=8, extra_body=body)
    assert answer["param"] == param, answer


def test_stop_only_when_the_grammar_accepts_the_text(client: openai.OpenAI, api: LiveServer) -> None:
    """``(b|c)a{1000000}`` compiles, then llguidance's lexer gives up after the first letter: the text is
    not whole, so ``length``, never ``stop``."""
    done = client.completions.create(
        model="gpt", prompt="a", max_tokens=8, extra_body={"guided_regex": "(b|c)a{1000000}"}
    )
    (choice,) = done.choices
    assert choice.text[:1] in ("b", "c") and choice.finish_reason == "length", choice
    rest = httpx.post(
        f"{api.url}/v1/generate",
        json={"prompt": "a", "max_new_tokens": 8, "structured_outputs": {"regex": "(b|c)a{1000000}"}},
        timeout=60,
    ).json()["results"][0]
    assert rest["finish_reason"] == "length"
    whole = client.completions.create(
        model="gpt", prompt="a", max_tokens=8, extra_body={"guided_choice": ["yes"]}
    )
    assert whole.choices[0].text == "yes" and whole.choices[0].finish_reason == "stop"


def test_compiling_grammars_does_not_stall_the_decoding_loop(tiny_models: Path) -> None:
    """Four constraints whose first mask takes a while, then a free request: the free one finishes while
    none of the four has produced a token, and the engine stepped meanwhile."""
    gpt = load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))
    assert gpt.tokenizer is not None
    prompt = list(gpt.tokenizer.encode("ROMEO:").ids)

    async def scenario() -> tuple[list[str], int]:
        engine = GenerationEngine(gpt, max_running=16, max_queue_size=64, queue_timeout_s=120)
        steps: list[int] = []
        engine._hooks.on_step = lambda size, seconds: steps.append(size)  # type: ignore[method-assign]
        await engine.start()
        events: list[str] = []
        try:
            slow = [
                engine.submit(
                    GenerationRequest(
                        prompt,
                        SamplingParams(
                            max_new_tokens=2, structured_outputs=StructuredOutput("regex", f"a{{{n}}}")
                        ),
                    )
                )
                for n in range(100_000, 100_004)
            ]

            async def first_token(i: int) -> None:
                async for event in slow[i]:
                    if event.index == 0:
                        events.append(f"constrained {i}")

            watchers = [asyncio.create_task(first_token(i)) for i in range(len(slow))]
            plain = await engine.submit(GenerationRequest(prompt, SamplingParams(max_new_tokens=8))).result()
            events.append("plain")
            steps_by_then = len(steps)
            await asyncio.gather(*watchers)
            for s in slow:
                assert (await s.result()).text == "aa"
            assert plain.completion_tokens == 8
            return events, steps_by_then
        finally:
            await engine.stop(timeout_s=60)

    events, steps = asyncio.run(scenario())
    assert events[0] == "plain" and len(events) == 5, events
    assert steps >= 8  # the plain request's prefill and decoding steps all ran while the four compiled


def test_the_log_holds_nothing_of_a_constraint(
    client: openai.OpenAI, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = "zqx_private_field"
    caplog.set_level(logging.DEBUG)
    cycle = {
        "$ref": "#/$defs/x",
        "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}, secret: {"type": "string"}},
    }
    refused(
        client.completions.create, model="gpt", prompt="a", max_tokens=4, extra_body={"guided_json": cycle}
    )
    broken = {  # the pattern fails in llguidance's lexer once reached: the choice ends there, "length"
        "type": "object",
        "properties": {secret: {"type": "string", "pattern": "(b|c)a{1000000}"}},
        "required": [secret],
    }
    done = client.completions.create(
        model="gpt", prompt="a", max_tokens=64, seed=1, extra_body={"guided_json": broken}
    )
    assert done.choices[0].finish_reason == "length" and done.choices[0].text.startswith('{"' + secret)
    assert done.usage is not None and done.usage.completion_tokens < 64, done
    out, err = capfd.readouterr()
    assert secret not in caplog.text and secret not in out and secret not in err
