"""MODEL_MEMORY_BUDGET's choice of what to unload (service/models/host.py ``_make_room``), on the
real tiny pipelines in process: the least recently used idle model goes, and a model at work never does,
whether a request holds it or a stream's sequences still run. Sizes are set, not measured here
(tests/test_model_control.py measures them in a process of their own)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.cache.response_cache import ResponseCache
from service.engine.sampling import SamplingParams
from service.errors import ModelTooLargeError, ModelUnavailableError, problem_of
from service.inference.limits import RequestLimits
from service.inference.service import InferenceService
from service.metadata import ANONYMOUS
from service.models.host import ModelHost
from service.models.loading import Loader
from service.settings import Settings

THREE = ["bert-classifier", "bert-tagger", "gpt"]


async def _core(models: Path) -> InferenceService:
    settings = Settings(
        MODEL_REPOSITORY=models, SERVED_MODELS=THREE, CACHE_ENABLED=False, MODEL_MEMORY_BUDGET=1000
    )
    loader = Loader(settings)
    host = ModelHost(await loader.startup(THREE), loader, memory_budget=1000)
    core = InferenceService(
        host, ResponseCache(None, ttl_s=60, prefix="t"), RequestLimits.from_settings(settings)
    )
    await core.start(warmup=False)
    for name in THREE:  # 400 bytes each, used in this order: the budget holds two
        core.host.memory.record(core.registry.versions[name][0], 400, 0)
        core.host.memory.touch(name)
    return core


def test_the_least_recently_used_idle_model_goes_and_one_at_work_stays(tiny_models: Path) -> None:
    async def scenario() -> None:
        core = await _core(tiny_models)
        try:
            held = core.registry.versions["bert-classifier"][0]  # the least recently used, but held
            tagger = core.registry.versions["bert-tagger"][0]
            with held.leased():
                await core.host._make_room("gpt", 0)
            assert set(core.registry.versions) == {"bert-classifier", "gpt"}
            assert core.host.memory.used() == 800
            await core.host.retired()
            assert all(g.freed for g in tagger.model.graphs.values())  # the one that went: sessions freed
        finally:
            await core.stop(5)

    asyncio.run(scenario())


def test_a_streams_running_sequences_keep_its_model(tiny_models: Path) -> None:
    async def scenario() -> None:
        core = await _core(tiny_models)
        try:
            core.host.memory.touch("bert-classifier")
            core.host.memory.touch("bert-tagger")  # gpt is now the least recently used
            streams = await core.open_streams(
                ANONYMOUS, ["KING:"], SamplingParams(max_new_tokens=40, temperature=0.0), "gpt"
            )
            await core.host._make_room("bert-classifier", 0)  # its lease is gone, its sequence is not
            assert "gpt" in core.registry.versions and "bert-tagger" not in core.registry.versions
            async for _ in streams:
                pass
            gpt, classifier = core.registry.versions["gpt"][0], core.registry.versions["bert-classifier"][0]
            with (
                pytest.raises(ModelUnavailableError, match="does not fit"),
                gpt.leased(),
                classifier.leased(),
            ):
                await core.host._make_room("bert-tagger", 400)  # both at work: nothing may go
        finally:
            await core.stop(5)

    asyncio.run(scenario())


def test_a_model_too_large_for_the_budget_alone_is_refused_and_nothing_is_unloaded_for_it(
    tiny_models: Path,
) -> None:
    """A model whose estimate (its last measurement, 2000 bytes) passes the budget (1000) by itself: its
    load is refused at once, and the two resident models stay, idle as they are."""

    async def scenario() -> None:
        core = await _core(tiny_models)
        try:
            gpt = core.registry.versions["gpt"][0]
            core.host.memory.record(gpt, 2000, 0)  # gpt measured at 2000 bytes: more than the budget of 1000
            for pipeline in core.registry.remove("gpt"):
                core.host._retire(pipeline)
                core.host.memory.forget(pipeline)
            await core.host.retired()
            assert set(core.registry.versions) == {"bert-classifier", "bert-tagger"}
            with pytest.raises(ModelTooLargeError, match="MODEL_MEMORY_BUDGET"):
                await core.resident(ANONYMOUS, "gpt")
            assert set(core.registry.versions) == {"bert-classifier", "bert-tagger"}  # nothing evicted
            assert problem_of(ModelTooLargeError("x")).status == 507
        finally:
            await core.stop(5)

    asyncio.run(scenario())
