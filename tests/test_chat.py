"""Chat: the Jinja2 template rendered as transformers renders it (sandboxed), and POST /v1/chat/completions
driven by the official ``openai`` client (``create``, streaming, ``.stream``, ``.parse``) against a real
server on the tiny GPT with ``CHAT_TEMPLATE`` set. The answer to a chat equals ``/v1/completions`` of the
rendered prompt. No mocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import BaseModel
from servers import LiveServer

from service.pipelines.chat_template import ChatTemplate, ChatTemplateError
from service.settings import Settings

TEMPLATE = Path(__file__).parent / "data" / "chat_template.jinja"
EOS = "<|endoftext|>"  # the tiny GPT's end of text, which the template writes after each turn
MESSAGES = [{"role": "user", "content": "KING HENRY:"}]

# Zephyr's template (HuggingFaceH4/zephyr-7b-beta's tokenizer_config.json) and the prompt transformers'
# apply_chat_template renders from it, as transformers' chat templating guide prints it.
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}"
    "\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)
ZEPHYR_MESSAGES = [
    {"role": "system", "content": "You are a friendly chatbot who always responds in the style of a pirate"},
    {"role": "user", "content": "How many helicopters can a human eat in one sitting?"},
]
ZEPHYR_PROMPT = (
    "<|system|>\nYou are a friendly chatbot who always responds in the style of a pirate</s>\n"
    "<|user|>\nHow many helicopters can a human eat in one sitting?</s>\n<|assistant|>\n"
)


def test_renders_as_transformers_does() -> None:
    zephyr = ChatTemplate(ZEPHYR, {"eos_token": "</s>"})
    assert zephyr.render(ZEPHYR_MESSAGES) == ZEPHYR_PROMPT
    assert zephyr.render(ZEPHYR_MESSAGES, add_generation_prompt=False) == ZEPHYR_PROMPT.removesuffix(
        "<|assistant|>\n"
    )
    ours = ChatTemplate(TEMPLATE.read_text(), {"eos_token": EOS})
    two = [*MESSAGES, {"role": "assistant", "content": "Once more"}, {"role": "user", "content": "unto"}]
    assert ours.render(two) == (
        f"<|system|>You are a poet.{EOS}\n<|user|>KING HENRY:{EOS}\n<|assistant|>Once more{EOS}\n"
        f"<|user|>unto{EOS}\n<|assistant|>"
    )
    assert ours.render(MESSAGES, kwargs={"default_system": "Be brief."}).startswith(
        f"<|system|>Be brief.{EOS}"
    )
    tojson = ChatTemplate("{{ messages[0] | tojson }}", {})
    assert tojson.render([{"role": "user", "content": "<b>é"}]) == '{"role": "user", "content": "<b>é"}'


def test_what_the_template_refuses_names_the_field() -> None:
    ours = ChatTemplate(TEMPLATE.read_text(), {"eos_token": EOS})
    with pytest.raises(ChatTemplateError) as caught:
        ours.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert caught.value.field == "messages" and "alternate" in caught.value.message
    with pytest.raises(ChatTemplateError) as caught:
        ours.render(MESSAGES, kwargs={"nonsense": 1})
    assert caught.value.field == "chat_template_kwargs.nonsense" and "default_system" in caught.value.message
    with pytest.raises(ChatTemplateError) as caught:
        ours.render(
            MESSAGES, kwargs={"messages": []}
        )  # the template's own inputs are not the client's to set
    assert caught.value.field == "chat_template_kwargs.messages"


def test_the_sandbox_keeps_a_template_from_python() -> None:
    # an unsafe attribute is undefined, and going on from it is refused: the template cannot reach Python
    assert ChatTemplate("[{{ ''.__class__ }}]", {}).render(MESSAGES) == "[]"
    for escape in ("{{ cycler.__init__.__globals__ }}", "{% set _ = messages.append({}) %}"):
        with pytest.raises(ChatTemplateError) as caught:
            ChatTemplate(escape, {}).render(MESSAGES)
        assert caught.value.field == "messages" and "unsafe" in caught.value.message


# --- the route ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_NEW_TOKENS=64, CHAT_TEMPLATE=TEMPLATE
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0)


def rendered(messages: list[dict[str, str]]) -> str:
    return ChatTemplate(TEMPLATE.read_text(), {"eos_token": EOS}).render(messages)


def test_chat_equals_a_completion_of_the_rendered_prompt(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="gpt", messages=MESSAGES, max_completion_tokens=12, temperature=0
    )  # type: ignore[arg-type]
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    plain = client.completions.create(model="gpt", prompt=rendered(MESSAGES), max_tokens=12, temperature=0)
    assert choice.message.content == plain.choices[0].text
    assert done.usage is not None and plain.usage is not None
    assert done.usage.prompt_tokens == plain.usage.prompt_tokens
    assert done.usage.completion_tokens == plain.usage.completion_tokens


def test_n_seed_stop_logprobs(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "messages": MESSAGES, "max_completion_tokens": 10, "temperature": 1.0}
    first = client.chat.completions.create(**args, n=3, seed=7)  # type: ignore[call-overload]
    again = client.chat.completions.create(**args, n=3, seed=7)  # type: ignore[call-overload]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    one = client.chat.completions.create(**args, seed=8)  # type: ignore[call-overload]
    assert one.choices[0].message.content == first.choices[1].message.content  # choice 1 samples with seed 8
    scored = client.chat.completions.create(**args, seed=3, logprobs=True, top_logprobs=2)  # type: ignore[call-overload]
    content = scored.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == scored.usage.completion_tokens  # type: ignore[union-attr]
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content).startswith(scored.choices[0].message.content or "")
    text = one.choices[0].message.content or ""
    if len(text) > 3:
        cut = client.chat.completions.create(**args, seed=8, stop=[text[2:4]])  # type: ignore[call-overload]
        assert cut.choices[0].message.content == text[: text.index(text[2:4])]
        assert cut.choices[0].finish_reason == "stop"


def test_streaming_create_and_stream_helper(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "messages": MESSAGES, "max_completion_tokens": 16, "temperature": 0}
    plain = client.chat.completions.create(**args).choices[0]  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.finish_reason
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    # the helper refuses a choice cut by its length: this one ends (end of text, +100) after 5 tokens
    ends = {**args, "logit_bias": {"0": 100}, "extra_body": {"min_tokens": 5}}
    short = client.chat.completions.create(**ends).choices[0]  # type: ignore[call-overload]
    assert short.finish_reason == "stop" and plain.message.content.startswith(short.message.content)  # type: ignore[union-attr]
    with client.chat.completions.stream(**ends) as stream:  # type: ignore[arg-type]
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == short.message.content == final.choices[0].message.content


class Verdict(BaseModel):
    ok: bool


def test_structured_chat_parses_with_the_client(client: openai.OpenAI) -> None:
    for seed in range(3):
        parsed = client.chat.completions.parse(
            model="gpt",
            messages=MESSAGES,
            response_format=Verdict,
            max_completion_tokens=20,
            seed=seed,  # type: ignore[arg-type]
        )
        assert isinstance(parsed.choices[0].message.parsed, Verdict)
    with client.chat.completions.stream(
        model="gpt",
        messages=MESSAGES,
        response_format=Verdict,
        max_completion_tokens=20,
        seed=4,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Verdict)
    loose = client.chat.completions.create(
        model="gpt",
        messages=MESSAGES,
        max_completion_tokens=40,
        seed=5,
        response_format={"type": "json_object"},  # type: ignore[arg-type]
    )
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(loose.choices[0].message.content or ""), dict)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "messages"),
        ({"extra_body": {"chat_template_kwargs": {"nonsense": 1}}}, "chat_template_kwargs.nonsense"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_completion_tokens": 65}, "max_completion_tokens"),
        ({"extra_body": {"guided_regex": "(("}}, "guided_regex"),
        ({"model": "no-such-model"}, "model"),
    ],
)
def test_chat_errors_are_400_naming_the_field(
    client: openai.OpenAI, body: dict[str, object], param: str
) -> None:
    args: dict[str, object] = {"model": "gpt", "messages": MESSAGES, "max_completion_tokens": 4, **body}
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**args)  # type: ignore[call-overload]
    assert caught.value.status_code == (404 if param == "model" else 400)
    assert isinstance(caught.value.body, dict) and str(caught.value.body["param"]).startswith(param), (
        caught.value.body
    )


def test_openapi_documents_chat(api: LiveServer) -> None:
    paths = httpx.get(f"{api.url}/schema/openapi.json", timeout=30).json()["paths"]
    chat = paths["/v1/chat/completions"]["post"]
    assert {"200", "400", "404"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
