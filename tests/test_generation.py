"""GenerationEngine on the real tiny GPT graph: KV-cache parity, continuous batching, streaming, limits.

References are recomputed in the test: each step re-runs the whole (left-padded)
prefix with an empty past, so the engine's cache, padding, joins and leaves are
checked against the plain definition of the model. Assertions are on tokens,
texts, counts and finish reasons, never on durations.

The tiny model is barely trained: plain argmax repeats one token forever, so the
"greedy" runs here add a repetition penalty (still deterministic) to get varied text.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from parity import check_close, check_outputs_equal

from service.engine.continuous_batching import GenerationEngine
from service.engine.decoder_graph import DecoderGraph
from service.engine.detokenizer import IncrementalDetokenizer
from service.engine.errors import PromptError, QueueFullError, QueueTimeoutError
from service.engine.generation_contract import (
    GenerationCancelledError,
    GenerationRequest,
    GenerationResult,
    NullGenerationObserver,
    TokenEvent,
)
from service.engine.generation_stream import GenerationStream
from service.engine.kv_cache import CacheLayout, KVCache
from service.engine.manifest import required
from service.engine.repository import LoadedModel, ModelLoadError, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import SamplingParams, TokenSampler

pytestmark = pytest.mark.timeout(300)

T = TypeVar("T")

GREEDY = SamplingParams(temperature=0.0, repetition_penalty=3.0)
PROMPTS = [
    "O",
    "KING:",
    "My lord,",
    "To be, or not to be",
    "What say you?",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
]
MAX_NEW = [40, 7, 25, 12, 33, 9, 30, 18]  # some run into the 64-token context instead


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=seed)


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))


def encode(gpt: LoadedModel, text: str) -> list[int]:
    assert gpt.tokenizer is not None
    return list(gpt.tokenizer.encode(text).ids)


def run_engine(gpt: LoadedModel, scenario: Callable[[GenerationEngine], Awaitable[T]], **options: Any) -> T:
    """Run ``scenario`` against a started engine on a fresh event loop, then stop the engine."""
    settings = {"max_running": 8, "max_queue_size": 64, "queue_timeout_s": 60.0, **options}

    async def main() -> T:
        engine = GenerationEngine(gpt, **settings)
        await engine.start()
        try:
            return await scenario(engine)
        finally:
            await engine.stop(timeout_s=30)

    return asyncio.run(main())


async def collect(stream: GenerationStream) -> tuple[list[TokenEvent], GenerationResult]:
    events = [event async for event in stream]
    return events, await stream.result()


def check_stream(events: list[TokenEvent], result: GenerationResult) -> None:
    """The streaming contract: one event per token, in order, and the texts join to the result text."""
    assert [e.index for e in events] == list(range(len(result.token_ids)))
    assert [e.token_id for e in events] == result.token_ids
    assert "".join(e.text for e in events) == result.text
    assert result.completion_tokens == len(result.token_ids)


def recompute(
    gpt: LoadedModel, prompts: Sequence[list[int]], params: Sequence[SamplingParams], steps: int
) -> list[list[int]]:
    """Reference decoding without a cache: every step runs the whole left-padded prefix with an empty past."""
    layout = CacheLayout.of(required(gpt.manifest.kv_cache))
    session = gpt.graphs["model"].session
    samplers = [TokenSampler(p) for p in params]
    sequences = [list(p) for p in prompts]
    for _ in range(steps):
        width = max(map(len, sequences))
        ids = np.zeros((len(sequences), width), dtype=np.int64)  # (B, T)
        mask = np.zeros((len(sequences), width), dtype=np.int64)  # (B, T)
        for row, seq in enumerate(sequences):
            ids[row, width - len(seq) :] = seq
            mask[row, width - len(seq) :] = 1
        feeds = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": np.clip(np.cumsum(mask, axis=1) - 1, 0, None),
            **dict(zip(layout.past_names, layout.empty(len(sequences)), strict=True)),
        }
        logits = session.run(["logits"], feeds)[0][:, -1, :]  # (B, V)
        for row, seq in enumerate(sequences):
            seq.append(samplers[row].next_token(logits[row], seq))
    return [seq[len(prompt) :] for seq, prompt in zip(sequences, prompts, strict=True)]


# --- KV cache parity ---------------------------------------------------------------------


def test_cached_decoding_equals_recomputation_alone(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[3])
    reference = recompute(gpt, [prompt], [GREEDY], 30)[0]

    async def scenario(engine: GenerationEngine) -> tuple[list[TokenEvent], GenerationResult]:
        return await collect(engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=30))))

    events, result = run_engine(gpt, scenario)
    check_stream(events, result)
    check_outputs_equal([result.token_ids], [reference], name_a="engine (KV cache)", name_b="recomputed")
    assert result.finish_reason == "length"
    assert len(set(reference)) > 3, "the reference should not be one repeated token"


def test_cached_decoding_equals_recomputation_left_padded_batch(gpt: LoadedModel) -> None:
    prompts = [encode(gpt, PROMPTS[i]) for i in (1, 3, 5)]
    assert len({len(p) for p in prompts}) == 3, "prompts of different lengths, so the batch is padded"
    steps = 64 - max(map(len, prompts))
    batched_reference = recompute(gpt, prompts, [GREEDY] * 3, steps)
    solo_reference = [recompute(gpt, [p], [GREEDY], steps)[0] for p in prompts]
    check_outputs_equal(
        batched_reference, solo_reference, name_a="recomputed batch", name_b="recomputed alone"
    )

    async def scenario(engine: GenerationEngine) -> list[GenerationResult]:
        streams = [
            engine.submit(GenerationRequest(p, replace(GREEDY, max_new_tokens=steps))) for p in prompts
        ]  # one prefill
        return list(await asyncio.gather(*(s.result() for s in streams)))

    results = run_engine(gpt, scenario)
    check_outputs_equal(
        [r.token_ids for r in results],
        solo_reference,
        name_a="engine batch (KV cache)",
        name_b="recomputed alone",
    )


def test_zero_length_past_prefill_then_one_step(gpt: LoadedModel) -> None:
    graph = DecoderGraph(gpt.graphs["model"], gpt.manifest)
    layout = graph.layout
    prompt = encode(gpt, PROMPTS[4])
    logits, cache = graph.prefill([prompt])  # empty past: (1, H, 0, Dh)
    assert logits.shape == (1, gpt.manifest.config["vocab_size"])
    assert cache.width == len(prompt) and cache.lengths.tolist() == [len(prompt)]
    assert all(t.shape == (1, layout.num_heads, len(prompt), layout.head_dim) for t in cache.tensors)

    token = int(np.argmax(logits[0]))
    step_logits, grown = graph.decode(np.array([token]), cache)
    full_logits, _ = graph.prefill([[*prompt, token]])  # the same prefix recomputed from scratch
    check_close(step_logits, full_logits, rtol=1e-4, atol=1e-4, name_a="decode step", name_b="prefill")
    assert grown.width == len(prompt) + 1


def test_prefill_all_positions_match_prefixes_alone(gpt: LoadedModel) -> None:
    # Prompt log-probabilities read every position of a left-padded batched prefill: each must be the
    # logits of that prefix run alone.
    graph = DecoderGraph(gpt.graphs["model"], gpt.manifest)
    short, long = encode(gpt, PROMPTS[0])[:3], encode(gpt, PROMPTS[4])
    logits, _ = graph.prefill_all([short, long])  # (2, L, V), short left-padded
    for row, prompt in enumerate((short, long)):
        for t in range(1, len(prompt) + 1):
            alone, _ = graph.prefill([prompt[:t]])
            at = logits[row, len(logits[row]) - len(prompt) + t - 1]
            check_close(at, alone[0], rtol=1e-4, atol=1e-4, name_a="batched position", name_b="prefix alone")


def test_engine_reports_logprobs_and_prompt_logprobs(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[1])
    # Without a penalty greedy picks the raw argmax, so the reported top-1 (raw logits) is the token.
    params = replace(GREEDY, repetition_penalty=1.0, max_new_tokens=5, logprobs=2, prompt_logprobs=1)

    async def scenario(engine: GenerationEngine) -> tuple[list[Any], Any]:
        stream = engine.submit(GenerationRequest(prompt, params))
        events = [e async for e in stream]
        return events, await stream.result()

    events, result = run_engine(gpt, scenario)
    assert result.logprobs is not None and len(result.logprobs) == len(result.token_ids)
    assert [e.logprob for e in events] == result.logprobs
    for entry, token in zip(result.logprobs, result.token_ids, strict=True):
        assert entry.token_id == token and entry.logprob is not None and entry.logprob <= 0
        assert len(entry.top) == 2 and entry.top[0] == (token, pytest.approx(entry.logprob))  # greedy
    assert result.prompt_logprobs is not None
    assert [e.token_id for e in result.prompt_logprobs] == prompt
    assert result.prompt_logprobs[0].logprob is None
    assert all(e.logprob is not None and len(e.top) == 1 for e in result.prompt_logprobs[1:])


def test_kv_cache_join_pads_left_and_leave_trims() -> None:
    heads, dim = 2, 3

    def cache(lengths: list[int], width: int, fill: float) -> KVCache:
        tensor = np.full((len(lengths), heads, width, dim), fill, dtype=np.float32)  # (B, H, W, Dh)
        return KVCache([tensor], np.array(lengths, dtype=np.int64), width)

    merged = KVCache.merge(cache([5, 2], 5, 1.0), cache([7], 7, 2.0))
    assert merged.width == 7 and merged.lengths.tolist() == [5, 2, 7]
    assert merged.tensors[0].shape == (3, heads, 7, dim)
    assert np.all(merged.tensors[0][:2, :, :2] == 0) and np.all(merged.tensors[0][:2, :, 2:] == 1)
    assert merged.attention_mask(new=1).tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1],
    ]

    left = merged.select([1, 0])  # the longest row leaves: its columns go
    assert left.width == 5 and left.lengths.tolist() == [2, 5]
    assert left.tensors[0].shape == (2, heads, 5, dim) and np.all(left.tensors[0] == 1)


# --- continuous batching -------------------------------------------------------------------


def requests(gpt: LoadedModel, params: Callable[[int], SamplingParams]) -> list[GenerationRequest]:
    return [
        GenerationRequest(encode(gpt, text), replace(params(i), max_new_tokens=max_new))
        for i, (text, max_new) in enumerate(zip(PROMPTS, MAX_NEW, strict=True))
    ]


async def solo(engine: GenerationEngine, reqs: list[GenerationRequest]) -> list[GenerationResult]:
    results = []
    for req in reqs:
        events, result = await collect(engine.submit(req))
        check_stream(events, result)
        results.append(result)
    return results


async def together(engine: GenerationEngine, reqs: list[GenerationRequest]) -> list[GenerationResult]:
    streams = [engine.submit(req) for req in reqs]
    return list(await asyncio.gather(*(s.result() for s in streams)))


async def staggered(engine: GenerationEngine, reqs: list[GenerationRequest]) -> list[GenerationResult]:
    """Each request is submitted once the previous one has streamed two tokens: joins into a running batch."""

    async def consume(stream: GenerationStream, progressed: asyncio.Event) -> GenerationResult:
        events = []
        async for event in stream:
            events.append(event)
            if len(events) == 2:
                progressed.set()
        progressed.set()
        result = await stream.result()
        check_stream(events, result)
        return result

    tasks = []
    for req in reqs:
        progressed = asyncio.Event()
        tasks.append(asyncio.create_task(consume(engine.submit(req), progressed)))
        await progressed.wait()
    return list(await asyncio.gather(*tasks))


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_concurrent_generations_match_solo_runs(gpt: LoadedModel, kind: str) -> None:
    reqs = requests(gpt, (lambda i: GREEDY) if kind == "greedy" else (lambda i: sampled(100 + i)))
    steps: list[int] = []

    class Steps(NullGenerationObserver):
        def on_step(self, batch_size: int, seconds: float) -> None:
            steps.append(batch_size)

    alone = run_engine(gpt, lambda e: solo(e, reqs))
    assert len({tuple(r.token_ids) for r in alone}) == len(reqs)
    assert {r.finish_reason for r in alone} == {"length"}
    for req, result in zip(reqs, alone, strict=True):  # max_new_tokens, or the context, whichever is first
        assert result.completion_tokens == min(req.sampling.max_new_tokens, 64 - len(req.prompt_ids))

    for scenario, options in [
        (together, {}),
        (staggered, {}),
        (together, {"max_running": 3}),  # the others wait, and join as places free up
    ]:
        steps.clear()
        shared = run_engine(gpt, lambda e, s=scenario: s(e, reqs), observer=Steps(), **options)
        check_outputs_equal(
            [(r.token_ids, r.text, r.finish_reason) for r in shared],
            [(r.token_ids, r.text, r.finish_reason) for r in alone],
            name_a=f"shared ({scenario.__name__}, {options})",
            name_b="alone",
        )
        assert max(steps) > 1, "the sequences should really have shared steps"
        assert max(steps) <= options.get("max_running", 8)


# --- sampling, limits, stop strings -----------------------------------------------------------


def test_seed_length_context_limit_and_stop_string(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[2])
    long_prompt = encode(gpt, PROMPTS[7] * 2)[:61]  # 3 positions left in the 64-token context

    async def scenario(engine: GenerationEngine) -> dict[str, tuple[list[TokenEvent], GenerationResult]]:
        out = {
            "seed_a": await collect(
                engine.submit(GenerationRequest(prompt, replace(sampled(7), max_new_tokens=30)))
            ),
            "seed_b": await collect(
                engine.submit(GenerationRequest(prompt, replace(sampled(7), max_new_tokens=30)))
            ),
            "context": await collect(
                engine.submit(GenerationRequest(long_prompt, replace(GREEDY, max_new_tokens=50)))
            ),
            "free": await collect(
                engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=40)))
            ),
        }
        text = out["free"][1].text
        stop = text[12:15]
        out["stop"] = await collect(
            engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=40, stop=("@@@", stop))))
        )
        return out

    runs = run_engine(gpt, scenario)
    for events, result in runs.values():
        check_stream(events, result)

    check_outputs_equal(
        [(runs["seed_a"][1].token_ids, runs["seed_a"][1].text)],
        [(runs["seed_b"][1].token_ids, runs["seed_b"][1].text)],
        name_a="seed 7, first run",
        name_b="seed 7, second run",
    )
    assert runs["seed_a"][1].finish_reason == "length" and runs["seed_a"][1].completion_tokens == 30
    assert runs["context"][1].finish_reason == "length" and runs["context"][1].completion_tokens == 3

    free, stopped = runs["free"][1], runs["stop"][1]
    stop = free.text[12:15]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.find(stop)]
    assert stop not in stopped.text
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]


def test_detokenizer_holds_back_incomplete_characters(gpt: LoadedModel) -> None:
    assert gpt.tokenizer is not None
    tokenizer = gpt.tokenizer
    ids = encode(gpt, "café naïve — ü")
    assert any(tokenizer.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids))), "no split character"
    detokenizer = IncrementalDetokenizer(tokenizer.decode)
    pieces = [detokenizer.step(ids[:n]) for n in range(1, len(ids) + 1)]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids) == "café naïve — ü"


def test_detokenizer_holds_back_a_possible_stop_string() -> None:
    words = ["a", "E", "N", "b", "EN", "D", "c"]

    def decode(ids: list[int]) -> str:
        return "".join(words[i] for i in ids)

    detokenizer = IncrementalDetokenizer(decode, stop=("END",))
    assert [detokenizer.step(list(range(n))) for n in range(1, 5)] == ["a", "", "", "ENb"]
    assert detokenizer.step([0, 1, 2, 3, 4]) == ""  # "EN" may begin "END"
    assert not detokenizer.stopped
    assert detokenizer.step([0, 1, 2, 3, 4, 5]) == ""
    assert detokenizer.stopped and detokenizer.text == "aENb"


# --- cancellation ------------------------------------------------------------------------------


def test_cancel_mid_stream_stops_the_sequence(gpt: LoadedModel) -> None:
    steps: list[int] = []
    cancels: list[bool] = []

    class Recorder(NullGenerationObserver):
        def on_step(self, batch_size: int, seconds: float) -> None:
            steps.append(batch_size)

        def on_cancel(self) -> None:
            cancels.append(True)

    long_prompt, other_prompt = encode(gpt, PROMPTS[0]), encode(gpt, PROMPTS[1])

    async def scenario(engine: GenerationEngine) -> None:
        doomed = engine.submit(GenerationRequest(long_prompt, replace(GREEDY, max_new_tokens=60)))
        other = engine.submit(GenerationRequest(other_prompt, replace(GREEDY, max_new_tokens=50)))
        seen = []
        async for event in doomed:
            seen.append(event)
            if len(seen) == 3:
                doomed.cancel()
        assert len(seen) == 3, "no event after cancel()"
        assert engine.cancelled_sequences == 1
        events, result = await collect(other)
        check_stream(events, result)
        assert result.completion_tokens == 50 and result.finish_reason == "length"
        assert [e async for e in doomed] == [], "a cancelled stream yields nothing more"
        with pytest.raises(GenerationCancelledError):
            await doomed.result()
        assert steps[-1] == 1, "the cancelled sequence left the running batch"
        # Row-steps: 2 in the prefill, 49 for the other; without the cancel the doomed one would add 59.
        assert sum(steps) <= 2 + 49 + 10, "the cancelled sequence stopped decoding"
        assert engine.running == 0

    run_engine(gpt, scenario, observer=Recorder())
    assert cancels == [True]


def test_abandoned_iteration_cancels(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[2])

    async def scenario(engine: GenerationEngine) -> None:
        closed = engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=50)))
        iterator = closed.__aiter__()
        await iterator.__anext__()
        await iterator.aclose()  # what a server does with the stream of a client that went away
        assert engine.cancelled_sequences == 1

        stream = engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=50)))
        task = await reading(stream)
        task.cancel()  # the handler task of a disconnected client is cancelled mid-iteration
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert engine.cancelled_sequences == 2
        for abandoned in (closed, stream):
            with pytest.raises(GenerationCancelledError):
                await abandoned.result()

    run_engine(gpt, scenario)


async def reading(stream: Any) -> asyncio.Task[None]:
    """A task that reads ``stream`` to its end, returned once the first token is out."""
    first = asyncio.Event()

    async def reader() -> None:
        async for _ in stream:
            first.set()

    task = asyncio.create_task(reader())
    await first.wait()
    return task


# --- admission --------------------------------------------------------------------------------


def test_full_queue_and_oversized_prompt(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[1])

    async def scenario(engine: GenerationEngine) -> None:
        with pytest.raises(PromptError, match="context"):
            engine.submit(
                GenerationRequest(list(range(1, 65)), replace(GREEDY, max_new_tokens=5))
            )  # 64 tokens: no room left
        waiting = [
            engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=5))) for _ in range(2)
        ]
        assert engine.waiting == 2  # submit never yields, so the loop has not admitted them yet
        with pytest.raises(QueueFullError) as info:
            engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=5)))
        assert info.value.retry_after_s >= 1
        for stream in waiting:
            assert (await stream.result()).completion_tokens == 5
        tight = await engine.submit(
            GenerationRequest(list(range(1, 64)), replace(GREEDY, max_new_tokens=5))
        ).result()
        assert tight.completion_tokens == 1 and tight.finish_reason == "length"

    run_engine(gpt, scenario, max_queue_size=2)


def test_queue_timeout(gpt: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    decode = DecoderGraph.decode

    def gated_decode(self: DecoderGraph, tokens: np.ndarray, cache: KVCache) -> Any:
        assert gate.wait(timeout=30), "the test never opened the gate"
        return decode(self, tokens, cache)

    monkeypatch.setattr(DecoderGraph, "decode", gated_decode)
    prompt = encode(gpt, PROMPTS[1])

    async def scenario(engine: GenerationEngine) -> None:
        running = engine.submit(GenerationRequest(prompt, replace(GREEDY, max_new_tokens=5)))
        task = await reading(running)  # its first token is out: it holds the only place; its next step blocks
        late = engine.submit(
            GenerationRequest(prompt, replace(GREEDY, max_new_tokens=5))
        )  # no place while max_running = 1
        with pytest.raises(QueueTimeoutError):
            await late.result()
        gate.set()
        await task
        assert (await running.result()).completion_tokens == 5

    run_engine(gpt, scenario, max_running=1, queue_timeout_s=0.2)


# --- CUDA: IO binding keeps the cache on the device (skipped without a usable CUDAExecutionProvider) ----


@pytest.mark.cuda
def test_cuda_io_binding_matches_recomputation_and_solo_runs(tiny_models: Path) -> None:
    """On the GPU, compared with the GPU's own references (its float rounding differs from the CPU's)."""
    try:
        gpu = load_model(tiny_models / "gpt", RuntimeOptions(device="cuda"))
    except ModelLoadError as exc:
        pytest.skip(f"no usable CUDAExecutionProvider: {exc}")
    assert gpu.graphs["model"].on_cuda
    reqs = requests(gpu, lambda i: GREEDY)
    reference = recompute(gpu, [reqs[3].prompt_ids], [GREEDY], reqs[3].sampling.max_new_tokens)[0]
    alone = run_engine(gpu, lambda e: solo(e, reqs))
    check_outputs_equal(
        [alone[3].token_ids], [reference], name_a="CUDA engine (KV cache)", name_b="CUDA recomputed"
    )
    for scenario in (together, staggered):
        shared = run_engine(gpu, lambda e, s=scenario: s(e, reqs))
        check_outputs_equal(
            [r.token_ids for r in shared],
            [r.token_ids for r in alone],
            name_a=f"CUDA shared ({scenario.__name__})",
            name_b="CUDA alone",
        )


# --- logit_bias, min_tokens -------------------------------------------------------------------------


def test_min_tokens_bans_the_end_of_text_and_logit_bias_steers_tokens(gpt: LoadedModel) -> None:
    prompt = encode(gpt, PROMPTS[1])
    eos = gpt.manifest.token("eos")
    # +100 on the end of text makes it the first token; min_tokens holds it off until the 5th
    ends = SamplingParams(max_new_tokens=20, temperature=0.0, logit_bias=((eos, 100.0),))

    async def scenario(engine: GenerationEngine) -> list[GenerationResult]:
        plain = await engine.submit(GenerationRequest(prompt, ends)).result()
        held = await engine.submit(GenerationRequest(prompt, replace(ends, min_tokens=5))).result()
        banned = await engine.submit(
            GenerationRequest(prompt, replace(GREEDY, max_new_tokens=12, logit_bias=((7, 100.0),)))
        ).result()
        return [plain, held, banned]

    plain, held, forced = run_engine(gpt, scenario)
    assert plain.token_ids == [eos] and plain.finish_reason == "eos"
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos and eos not in held.token_ids[:-1]
    assert held.finish_reason == "eos"
    assert forced.token_ids[0] == 7  # the repetition penalty then pushes it away again


def test_min_tokens_ignores_a_stop_string_before_it() -> None:
    pieces = ["a", "b", ".", "c", ".", "d"]

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    early = IncrementalDetokenizer(decode, ["."])
    texts = []
    for n in range(1, len(pieces) + 1):  # the engine stops asking once it has stopped
        texts.append(early.step(list(range(n)), stop_allowed=n >= 4))
        if early.stopped:
            break
    assert early.stopped and early.text == "ab.c"  # the "." at 3 came before min_tokens 4; the one at 5 stops
    assert "".join(texts) == "ab.c" and n == 5
