"""Structured output on the real tiny GPT: every completed output keeps to its constraint (a JSON schema
checked with ``jsonschema``, a regex, a list of choices, any JSON object), over 50 seeds per case, with
constrained and free sequences sharing the running batch; the doors' fields, streaming, and the 400s for
constraints that do not compile. Assertions are on texts and finish reasons, never on durations."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from servers import LiveServer

from service.engine.continuous_batching import GenerationEngine
from service.engine.generation_contract import GenerationRequest, GenerationResult
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import SamplingParams
from service.engine.structured_output import GrammarCompiler, StructuredOutput, masks_to_allowed
from service.settings import Settings

pytestmark = pytest.mark.timeout(600)

SEEDS = range(50)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["glad", "sad"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "mood", "ok"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,5}( [A-Z][a-z]{1,4}){0,2}"
CHOICES = ["yes", "no", "maybe so", "ROMEO"]
CASES = {
    "json": StructuredOutput.json_schema(SCHEMA),
    "regex": StructuredOutput("regex", REGEX),
    "choice": StructuredOutput.choice(CHOICES),
    "json_object": StructuredOutput("json_object"),
}


def keeps_to(case: str, text: str) -> bool:
    if case == "json":
        jsonschema.validate(json.loads(text), SCHEMA)  # raises with the reason when it does not
        return True
    if case == "regex":
        return re.fullmatch(REGEX, text) is not None
    if case == "choice":
        return text in CHOICES
    return isinstance(json.loads(text), dict)


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))


def params(case: str, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=56, temperature=0.9, seed=seed, structured_outputs=CASES[case])


def test_masks_unpack_llguidance_bits(gpt: LoadedModel) -> None:
    assert gpt.tokenizer is not None
    compiler = GrammarCompiler(gpt.tokenizer, 400, 0)
    bits = np.zeros((1, 13), np.int32)
    bits[0, 0] = 0b101  # tokens 0 and 2
    bits[0, 12] = np.int32(1 << 15)  # token 399
    allowed = masks_to_allowed(bits, 400)
    assert allowed.shape == (1, 400) and np.flatnonzero(allowed[0]).tolist() == [0, 2, 399]
    grammar = compiler.start(StructuredOutput.choice(["yes", "no"]))
    (mask,) = compiler.masks([grammar])
    allowed_texts = {gpt.tokenizer.decode([int(t)]) for t in np.flatnonzero(mask)}
    assert allowed_texts and all("yes".startswith(t) or "no".startswith(t) for t in allowed_texts)


def test_every_completed_output_keeps_to_its_constraint_in_a_shared_batch(gpt: LoadedModel) -> None:
    """50 seeds per case, all submitted together with free sequences: one running batch. Each constrained
    result equals the same request decoded alone (the mask is per sequence)."""
    assert gpt.tokenizer is not None
    prompt = list(gpt.tokenizer.encode("ROMEO:").ids)
    free = [SamplingParams(max_new_tokens=30, temperature=0.9, seed=seed) for seed in range(8)]

    async def scenario() -> tuple[dict[str, list[GenerationResult]], list[GenerationResult], list[int]]:
        engine = GenerationEngine(gpt, max_running=64, max_queue_size=512, queue_timeout_s=120)
        steps: list[int] = []
        engine._hooks.on_step = lambda size, seconds: steps.append(size)  # type: ignore[method-assign]
        await engine.start()
        try:
            streams = {
                case: [engine.submit(GenerationRequest(prompt, params(case, seed))) for seed in SEEDS]
                for case in CASES
            }
            others = [engine.submit(GenerationRequest(prompt, p)) for p in free]
            results = {case: [await s.result() for s in ss] for case, ss in streams.items()}
            loose = [await s.result() for s in others]
            for case in CASES:  # alone: the first three seeds again, one at a time
                for seed in range(3):
                    again = await engine.submit(GenerationRequest(prompt, params(case, seed))).result()
                    assert again.token_ids == results[case][seed].token_ids, (case, seed)
            return results, loose, steps
        finally:
            await engine.stop(timeout_s=30)

    results, loose, steps = asyncio.run(scenario())
    assert max(steps) > 16, "constrained and free sequences should have shared steps"
    for case, outs in results.items():
        completed = [r for r in outs if r.finish_reason in ("stop", "eos")]
        assert len(completed) >= 25, f"{case}: only {len(completed)} of 50 completed"
        for r in completed:
            assert keeps_to(case, r.text), (case, r.text)
        for r in outs:
            if r.finish_reason == "length":
                assert r.completion_tokens == 56
    assert not all(keeps_to("choice", r.text) for r in loose)  # the free ones were not constrained


def test_length_before_the_grammar_completes_says_length(gpt: LoadedModel) -> None:
    assert gpt.tokenizer is not None
    prompt = list(gpt.tokenizer.encode("KING:").ids)
    long = SamplingParams(max_new_tokens=5, seed=1, structured_outputs=StructuredOutput("regex", "[a-z]{40}"))
    must_wait = replace(
        long, max_new_tokens=30, min_tokens=3, structured_outputs=StructuredOutput("regex", "a+")
    )

    async def scenario() -> list[GenerationResult]:
        engine = GenerationEngine(gpt, max_running=8, max_queue_size=64, queue_timeout_s=60)
        await engine.start()
        try:
            return [await engine.submit(GenerationRequest(prompt, p)).result() for p in (long, must_wait)]
        finally:
            await engine.stop(timeout_s=30)

    cut, held = asyncio.run(scenario())
    assert cut.finish_reason == "length" and cut.completion_tokens == 5 and re.fullmatch("[a-z]+", cut.text)
    assert re.fullmatch("a+", held.text) and held.completion_tokens >= 3


# --- the doors ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_NEW_TOKENS=64)
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="anything", max_retries=0)


def test_openai_response_format_and_vllm_fields(client: openai.OpenAI) -> None:
    args = {"model": "gpt", "prompt": "ROMEO:", "max_tokens": 48, "temperature": 0.9}
    schema_format = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
    }
    for seed in range(5):
        done = client.completions.create(**args, seed=seed, extra_body={"response_format": schema_format})  # type: ignore[call-overload]
        (choice,) = done.choices
        if choice.finish_reason == "stop":
            assert keeps_to("json", choice.text)
        streamed = client.completions.create(  # type: ignore[call-overload]
            **args, seed=seed, stream=True, extra_body={"response_format": schema_format}
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    for body, case in [
        ({"guided_regex": REGEX}, "regex"),
        ({"guided_choice": CHOICES}, "choice"),
        ({"guided_json": SCHEMA}, "json"),
        ({"structured_outputs": {"choice": CHOICES}}, "choice"),
        ({"response_format": {"type": "json_object"}}, "json_object"),
    ]:
        done = client.completions.create(**args, seed=3, n=3, extra_body=body)  # type: ignore[call-overload]
        for c in done.choices:
            assert c.finish_reason == "length" or keeps_to(case, c.text), (body, c.text)


def test_rest_and_v2_take_the_same_constraints(api: LiveServer) -> None:
    body = {"prompt": "ROMEO:", "max_new_tokens": 40, "seed": 2, "structured_outputs": {"choice": CHOICES}}
    rest = httpx.post(f"{api.url}/v1/generate", json=body, timeout=60).json()["results"][0]
    assert rest["text"] in CHOICES
    v2 = triton.InferenceServerClient(api.url.removeprefix("http://"))
    prompt = triton.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"ROMEO:"], dtype=object))
    parameters = {"max_tokens": 40, "seed": 2, "guided_choice": json.dumps(CHOICES)}
    answer = v2.infer("gpt", [prompt], parameters=parameters)
    assert [t.decode() for t in answer.as_numpy("text")] == [rest["text"]]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"guided_regex": "a(b"}, "guided_regex"),
        ({"guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "guided_json"),
        ({"guided_json": "{not json"}, "guided_json"),
        (
            {"guided_json": {"type": "array", "uniqueItems": True}},
            "guided_json",
        ),  # a keyword it cannot enforce
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_grammar": "start: (("}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
    ],
)
def test_a_constraint_that_does_not_compile_is_a_400_naming_it(
    client: openai.OpenAI, body: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="gpt", prompt="a", max_tokens=4, extra_body=body)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param, caught.value.body


def test_rest_and_v2_name_the_constraint_they_refuse(api: LiveServer) -> None:
    rest = httpx.post(
        f"{api.url}/v1/generate", json={"prompt": "a", "structured_outputs": {"regex": "(("}}, timeout=60
    )
    assert rest.status_code == 422 and rest.json()["error"]["field"] == "structured_outputs.regex"
    v2 = httpx.post(
        f"{api.url}/v2/models/gpt/infer",
        json={
            "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
            "parameters": {"guided_regex": "(("},
        },
        timeout=60,
    )
    assert v2.status_code == 400 and "parameters.guided_regex" in v2.text
