"""MODEL_INSTANCES on the tiny models: N sessions per graph with the intra-op threads split, each compute
thread on its own, the same answers from every instance, and one instance for a continuous-batching model."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from service.engine import instances
from service.engine.batcher import BatchPolicy
from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.pipelines.classify import TextClassifier
from service.pipelines.translate import DecodingParams, Translator

TEXTS = ["a gorgeous, witty, seductive movie.", "slow", "dull " * 40, "it's a charming journey."]


def test_each_graph_has_one_session_per_instance_with_its_share_of_the_threads(tiny_models: Path) -> None:
    model = load_model(
        tiny_models / "translator", RuntimeOptions(device="cpu", intra_op_threads=4, instances=2)
    )
    assert model.instances == 2
    for graph in model.graphs.values():
        sessions = graph._sessions
        assert sessions is not None and len(sessions) == 2 and sessions[0] is not sessions[1]
        assert [s.get_session_options().intra_op_num_threads for s in sessions] == [2, 2]
    single = load_model(tiny_models / "translator", RuntimeOptions(device="cpu", intra_op_threads=4))
    assert single.instances == 1
    assert single.graphs["encoder"].session.get_session_options().intra_op_num_threads == 4
    assert instances.threads_each(0, 64) == 1  # never below one thread


def test_a_text_generation_model_keeps_one_instance(tiny_models: Path) -> None:
    model = load_model(tiny_models / "gpt", RuntimeOptions(device="cpu", instances=3))
    assert model.instances == 1
    assert all(g.instances == 1 for g in (*model.graphs.values(), *model.inplace.values()))


def test_every_instance_gives_the_same_answers_as_one_session(tiny_models: Path) -> None:
    """Each compute thread (bound as the batcher binds them) runs its own session: same logits, exactly."""
    policy = BatchPolicy(32, 8192, 0.0, 256, 30.0)
    one = TextClassifier(load_model(tiny_models / "bert-classifier", RuntimeOptions(device="cpu")), policy)
    two = TextClassifier(
        load_model(tiny_models / "bert-classifier", RuntimeOptions(device="cpu", instances=2)), policy
    )
    ids = [e.ids for e in one.encode(TEXTS)]
    reference = np.stack(one.run_batch(ids))

    together = threading.Barrier(2)  # the pairs of calls meet: no thread can take both of a pair

    def on_own_instance(_: int) -> tuple[int, np.ndarray]:
        together.wait(timeout=30)
        return instances.current(), np.stack(two.run_batch(ids))

    with ThreadPoolExecutor(max_workers=2, initializer=instances.binder()) as pool:
        answers = list(pool.map(on_own_instance, range(8)))
    assert {index for index, _ in answers} == {0, 1}
    for _, logits in answers:
        np.testing.assert_array_equal(logits, reference)


def test_a_translator_with_two_instances_translates_as_one_does(tiny_models: Path) -> None:
    """Through the pipeline and its batcher: concurrent requests, batches on both instances at once (each
    with its own in-place KV step and binding), the same tokens as one instance."""
    policy = BatchPolicy(2, 8192, 0.0, 256, 30.0)
    sentences = [
        "A man is riding a bike.",
        "Two dogs play in the snow near a big red barn.",
        "A girl reads.",
        "People walk down a busy street in the city at night.",
    ] * 4

    async def translate(options: RuntimeOptions) -> tuple[int, list[list[int]]]:
        model = load_model(tiny_models / "translator", options)
        pipeline = Translator(model, policy, 64)
        await pipeline.start()
        try:
            outcomes = await asyncio.gather(
                *(
                    pipeline.translate([s], DecodingParams(beam_size=1 + n % 2))
                    for n, s in enumerate(sentences)
                )
            )
        finally:
            await pipeline.stop(5)
        tokens = [seq.token_ids for o in outcomes for r in o.results for seq in r.sequences]
        return pipeline.batcher.compute_threads, tokens

    one_threads, one = asyncio.run(translate(RuntimeOptions(device="cpu")))
    two_threads, two = asyncio.run(translate(RuntimeOptions(device="cpu", instances=2)))
    assert (one_threads, two_threads) == (1, 2)
    assert two == one


def test_the_setting_reaches_the_sessions() -> None:
    from service.models.loading import runtime_options
    from service.settings import Settings

    assert runtime_options(Settings(model_instances=3)).instances == 3
    assert runtime_options(Settings()).instances == 1
