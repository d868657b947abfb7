"""Automatic prefix caching on the real tiny GPT: decoding after a reused prefix gives exactly the tokens
that recomputing it gives (greedy and seeded, over many seeds, alone and in shared prefill groups), LRU
within the memory bound, and the metrics. Assertions are on token ids and counts, never on durations."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from servers import LiveServer, metric

from service.engine.continuous_batching import GenerationEngine
from service.engine.generation_contract import GenerationRequest, GenerationResult, NullGenerationObserver
from service.engine.prefix_cache import PrefixCache
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import SamplingParams
from service.settings import Settings

pytestmark = pytest.mark.timeout(600)
T = TypeVar("T")

SHARED = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak"
ENDINGS = [", speak.", " on.", "!", ", good", " now, now", "."]
BLOCK = 8


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))


class Counts(NullGenerationObserver):
    def __init__(self) -> None:
        self.queried = self.hit = self.blocks = 0

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int, blocks: int, bytes: int) -> None:
        self.queried += queried_tokens
        self.hit += hit_tokens
        self.blocks = blocks


def run(gpt: LoadedModel, scenario: Callable[[GenerationEngine], Awaitable[T]], **options: Any) -> T:
    settings = {"max_running": 16, "max_queue_size": 256, "queue_timeout_s": 120.0, **options}

    async def main() -> T:
        engine = GenerationEngine(gpt, **settings)
        await engine.start()
        try:
            return await scenario(engine)
        finally:
            await engine.stop(timeout_s=30)

    return asyncio.run(main())


def prompts(gpt: LoadedModel) -> list[list[int]]:
    assert gpt.tokenizer is not None
    out = [list(gpt.tokenizer.encode(SHARED + ending).ids) for ending in ENDINGS]
    assert len({tuple(p[: 3 * BLOCK]) for p in out}) == 1 and all(len(p) < 56 for p in out)
    return out


def kinds(seed: int) -> list[SamplingParams]:
    return [
        SamplingParams(max_new_tokens=10, temperature=0.0, repetition_penalty=3.0),
        SamplingParams(max_new_tokens=10, temperature=0.8, top_k=20, top_p=0.9, seed=seed),
    ]


async def one_by_one(engine: GenerationEngine, reqs: list[GenerationRequest]) -> list[GenerationResult]:
    return [await engine.submit(r).result() for r in reqs]


async def all_at_once(engine: GenerationEngine, reqs: list[GenerationRequest]) -> list[GenerationResult]:
    return list(await asyncio.gather(*(s.result() for s in engine.submit_all(reqs))))


def test_keys_chain_every_token_before_the_block() -> None:
    cache = PrefixCache(4, 1 << 20)
    a, b = cache.keys([1, 2, 3, 4, 5, 6, 7, 8], 2), cache.keys([9, 2, 3, 4, 5, 6, 7, 8], 2)
    assert a[1] != b[1]  # same tokens in block 1, another prefix before it: another key
    assert cache.keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == a
    tensors = [np.arange(2 * 3 * 9 * 2, dtype=np.float32).reshape(2, 3, 9, 2) for _ in range(4)]
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], tensors, row=1, end=9)  # row 1's prompt: columns 1..8
    assert cache.reusable([1, 2, 3, 4, 5, 6, 7, 8]) == 4  # the last token is always computed
    assert cache.reusable([1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    got = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 0], 6)
    assert got.shape == (4, 3, 6, 2) and np.array_equal(got[0], tensors[0][1, :, 1:7])


def test_reused_prefixes_decode_exactly_as_recomputed(gpt: LoadedModel) -> None:
    """Greedy and seeded, 12 seeds each, the six prompts one by one and all at once: the tokens with the
    cache equal the tokens without it."""
    reqs = [
        GenerationRequest(p, params) for seed in range(12) for params in kinds(seed) for p in prompts(gpt)
    ]
    plain = run(gpt, lambda e: one_by_one(e, reqs))
    counts = Counts()
    cached = run(
        gpt,
        lambda e: one_by_one(e, reqs),
        prefix_cache_bytes=1 << 22,
        prefix_block_tokens=BLOCK,
        observer=counts,
    )
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert counts.hit >= (len(reqs) - 1) * 3 * BLOCK  # every prompt after the first reuses 3 blocks or more

    async def batched_then_alone(engine: GenerationEngine) -> list[GenerationResult]:
        first = await all_at_once(engine, reqs[: 2 * len(ENDINGS)])  # stored by one prefill, then reused
        return first + await one_by_one(engine, reqs[2 * len(ENDINGS) :])

    together = run(gpt, batched_then_alone, prefix_cache_bytes=1 << 22, prefix_block_tokens=BLOCK)
    assert [r.token_ids for r in together] == [r.token_ids for r in plain]


def test_hits_and_misses_prefilled_in_one_admission(gpt: LoadedModel) -> None:
    """A warm prefix and cold prompts admitted together: each group computes its own rest, same tokens."""
    assert gpt.tokenizer is not None
    cold = [list(gpt.tokenizer.encode(text).ids) for text in ("KING:", "ROMEO:\nBut soft, what light", "O")]
    warm = prompts(gpt)
    params = kinds(5)
    reqs = [GenerationRequest(p, params[i % 2]) for i, p in enumerate([*warm, *cold])]
    plain = run(gpt, lambda e: all_at_once(e, reqs))

    async def scenario(engine: GenerationEngine) -> list[GenerationResult]:
        await engine.submit(GenerationRequest(warm[0], replace(params[0], max_new_tokens=1))).result()
        return await all_at_once(engine, reqs)

    counts = Counts()
    cached = run(gpt, scenario, prefix_cache_bytes=1 << 22, prefix_block_tokens=BLOCK, observer=counts)
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert counts.hit >= len(warm) * 3 * BLOCK


def test_lru_within_the_memory_bound(gpt: LoadedModel) -> None:
    layout = gpt.manifest.kv_cache
    assert layout is not None
    block_bytes = 2 * layout.num_layers * layout.num_heads * BLOCK * layout.head_dim * 4
    counts = Counts()
    reqs = [GenerationRequest(p, kinds(0)[0]) for p in prompts(gpt)] * 2
    plain = run(gpt, lambda e: one_by_one(e, reqs))
    cached = run(
        gpt,
        lambda e: one_by_one(e, reqs),
        prefix_cache_bytes=5 * block_bytes,
        prefix_block_tokens=BLOCK,
        observer=counts,
    )
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert counts.blocks <= 5 and counts.hit > 0


def test_metrics_report_hits_and_resident_blocks(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, PREFIX_CACHE_BLOCK_TOKENS=BLOCK)
    with LiveServer(settings) as server:
        body = {"prompt": SHARED + "!", "max_new_tokens": 2, "temperature": 0}
        for _ in range(2):
            assert httpx.post(f"{server.url}/v1/generate", json=body, timeout=60).status_code == 200
        queried = metric(server.url, "tserve_prefix_cache_queried_tokens_total", model="gpt")
        hits = metric(server.url, "tserve_prefix_cache_hit_tokens_total", model="gpt")
        blocks = metric(server.url, "tserve_prefix_cache_blocks", model="gpt")
    assert queried > 0 and hits >= 3 * BLOCK and blocks >= 3
