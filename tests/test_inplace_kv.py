"""The KV cache updated in place: the step graph, the buffer, and the engine decoding with them.

The export writes, for GPT's fused and int8 variants, a decoding-step graph whose attention is
GroupQueryAttention over a preallocated buffer (``model_export/inplace_kv.py``); the service binds
``past`` and ``present`` to the same memory (``KVBuffer``). Everything here compares numbers with
the Concat graphs or with full recomputation: the in-place step must give exactly the tokens of
both, alone and in a batch whose rows join and leave.
"""

from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from parity import check_close, check_outputs_equal
from servers import LiveServer
from test_generation import GREEDY, PROMPTS, encode, recompute, requests, run_engine, sampled, solo, staggered

from model_export.inplace_kv import SEQLENS, TOTAL, step_difference
from service.engine.decoder_graph import DecoderGraph
from service.engine.generation_contract import GenerationRequest, GenerationResult
from service.engine.kv_cache import CacheLayout, KVBuffer, KVCache
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.translate import prepare_source
from service.settings import Settings

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu"))


@pytest.fixture(scope="module")
def gpt_concat(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", RuntimeOptions(device="cpu", kv_cache="concat"))


def manifest(tiny_models: Path) -> dict:
    return json.loads((tiny_models / "gpt" / "manifest.json").read_text())


# --- the step graph -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["fused", "int8"])
def test_step_graph_attends_in_place_with_one_gqa_per_layer(tiny_models: Path, variant: str) -> None:
    record = manifest(tiny_models)["variants"][variant]
    kv = manifest(tiny_models)["kv_cache"]
    model = onnx.load(str(tiny_models / "gpt" / record["inplace_decode"]["model"]))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["GroupQueryAttention"] == kv["num_layers"]
    assert ops["Attention"] == 0 and ops["Softmax"] == 0
    past = {f"past_{kind}.{i}" for i in range(kv["num_layers"]) for kind in ("key", "value")}
    concats_of_past = [n for n in model.graph.node if n.op_type == "Concat" and set(n.input) & past]
    assert concats_of_past == [], "no step may copy the past into a new tensor"
    inputs = [i.name for i in model.graph.input]
    assert "attention_mask" not in inputs and {SEQLENS, TOTAL, "input_ids", "position_ids"} <= set(inputs)
    for gqa in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        assert gqa.input[3].startswith("past_key.") and gqa.output[1].startswith("present_key.")
        # q, k, v projected by one packed MatMul (int8: the packed fused step graph, quantized)
        assert gqa.input[1] == gqa.input[2] == "", list(gqa.input)
    assert ops["Reshape"] == 0, "no splitting into heads and merging back around the attention"
    # the export measured it against the variant's own Concat step, and the file is hashed
    assert record["inplace_max_abs_diff"] <= 1e-5
    assert record["inplace_decode"]["model"] in manifest(tiny_models)["files"]


@pytest.mark.parametrize("variant", ["fused", "int8"])
@pytest.mark.parametrize("lengths", [(0,), (0, 3), (7, 0, 1, 12)])
def test_step_graph_equals_the_concat_step_with_an_empty_past(
    tiny_models: Path, lengths: tuple[int, ...], variant: str
) -> None:
    folder = tiny_models / "gpt"
    record = manifest(tiny_models)["variants"][variant]
    diff = step_difference(
        str(folder / record["graphs"]["model"]),
        str(folder / record["inplace_decode"]["model"]),
        manifest(tiny_models)["kv_cache"],
        lengths,
    )
    assert diff <= 1e-5, f"in-place step differs from the Concat step by {diff} for past lengths {lengths}"


def test_service_chooses_the_step_graph_by_setting(
    tiny_models: Path, gpt: LoadedModel, gpt_concat: LoadedModel
) -> None:
    default = "int8" if manifest(tiny_models)["variants"]["int8"]["serve_by_default"] else "fused"
    assert gpt.variant.name == default and set(gpt.inplace) == {"model"}
    assert gpt.inplace["model"].path.name == f"model.{default}.inplace.onnx"
    assert gpt_concat.inplace == {} and gpt_concat.variant.name == default
    reference = load_model(gpt.path, RuntimeOptions(device="cpu", variant="reference"))
    assert reference.inplace == {}, "the reference graphs stay exactly as exported"


# --- the buffer -----------------------------------------------------------------------------


def test_buffer_joins_leaves_and_grows_keeping_each_rows_prefix() -> None:
    layout = CacheLayout(["k"], ["pk"], num_heads=2, head_dim=3, dtype=np.dtype(np.float32))

    def prefilled(lengths: list[int], first: float) -> KVCache:
        width = max(lengths)
        tensor = np.zeros((len(lengths), 2, width, 3), np.float32)
        for row, length in enumerate(lengths):  # right-aligned, as a prefill leaves it
            tensor[row, :, width - length :] = first + row
        return KVCache([tensor], np.array(lengths, np.int64), width)

    buffer = KVBuffer(layout, max_length=16, capacity=2)
    buffer.extend(prefilled([3, 1], 10.0))
    assert buffer.lengths.tolist() == [3, 1] and buffer.capacity == 2
    assert np.all(buffer.buffers[0][0, :, :3] == 10.0) and np.all(buffer.buffers[0][1, :, :1] == 11.0)
    buffer.extend(prefilled([5], 20.0))  # outgrows the capacity: doubles, rows kept
    assert buffer.capacity == 4 and buffer.lengths.tolist() == [3, 1, 5]
    assert np.all(buffer.buffers[0][0, :, :3] == 10.0) and np.all(buffer.buffers[0][2, :, :5] == 20.0)
    first = buffer.buffers[0]
    buffer.keep([0, 2])  # the middle row leaves: the last one moves down, in the same memory
    assert buffer.buffers[0] is first and buffer.lengths.tolist() == [3, 5]
    assert np.all(buffer.buffers[0][1, :, :5] == 20.0) and np.all(buffer.buffers[0][0, :, :3] == 10.0)
    with pytest.raises(AssertionError):
        buffer.extend(prefilled([17], 0.0))  # longer than the buffer


# --- decoding -------------------------------------------------------------------------------


def test_in_place_greedy_equals_recomputation_alone(gpt: LoadedModel) -> None:
    graph = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    assert graph.in_place
    prompt = encode(gpt, PROMPTS[3])
    steps = 64 - len(prompt)
    logits, cache = graph.prefill([prompt])
    buffer = graph.start(cache)
    assert isinstance(buffer, KVBuffer) and buffer.max_length == 64
    seq = list(prompt)
    sampler_ids = []
    from service.engine.sampling import TokenSampler

    sampler = TokenSampler(GREEDY)
    token = sampler.next_token(logits[0], seq)
    for _ in range(steps - 1):
        seq.append(token)
        sampler_ids.append(token)
        logits, same = graph.decode(np.array([token]), buffer)
        assert same is buffer, "the step updates the buffer, it does not make a new cache"
        token = sampler.next_token(logits[0], seq)
    sampler_ids.append(token)
    assert int(buffer.lengths[0]) == 63, "the context's last position was written, none beyond"
    check_outputs_equal(
        [sampler_ids], recompute(gpt, [prompt], [GREEDY], steps), name_a="in place", name_b="recomputed"
    )


def test_step_binding_follows_the_buffers_shape_not_only_its_address(gpt: LoadedModel) -> None:
    # A new buffer may get a freed one's memory with another length (the translator's buffers are as
    # long as each call's step limit): the step graph's binding must follow the shape too.
    graph = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    layout = graph.layout
    _, cache = graph.prefill([encode(gpt, PROMPTS[3])])
    memory = [np.zeros(layout.num_heads * 64 * layout.head_dim, np.float32) for _ in layout.past_names]

    def buffer_over(length: int) -> KVBuffer:
        for m in memory:
            m[:] = np.nan  # what the last buffer left there must not be read through the new one
        buffer = KVBuffer(layout, length, capacity=1)
        buffer.buffers = [m[: m.size * length // 64].reshape(1, layout.num_heads, length, -1) for m in memory]
        return buffer.extend(cache)

    first, _ = graph.decode(np.array([7]), buffer_over(40))
    second, _ = graph.decode(np.array([7]), buffer_over(48))  # the same addresses, another shape
    check_close(second, first, rtol=1e-5, atol=1e-5, name_a="48-column buffer", name_b="40-column buffer")


def test_in_place_step_logits_equal_concat_step_logits(gpt: LoadedModel) -> None:
    concat = DecoderGraph(gpt.graphs["model"], gpt.manifest)
    inplace = DecoderGraph(gpt.graphs["model"], gpt.manifest, gpt.inplace["model"])
    prompts = [encode(gpt, PROMPTS[i]) for i in (0, 5, 2)]  # different lengths: a padded prefill
    _, cache = concat.prefill(prompts)
    buffer = inplace.start(cache)
    tokens = np.array([11, 12, 13])
    for _ in range(4):
        want, cache = concat.decode(tokens, cache)
        got, buffer = inplace.decode(tokens, buffer)
        check_close(got, want, rtol=1e-5, atol=1e-5, name_a="in place", name_b="Concat")
        tokens = np.argmax(want, axis=-1)


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_rows_joining_and_leaving_give_the_tokens_of_the_concat_engine(
    gpt: LoadedModel, gpt_concat: LoadedModel, kind: str
) -> None:
    reqs = requests(gpt, (lambda i: GREEDY) if kind == "greedy" else (lambda i: sampled(300 + i)))
    concat_alone = run_engine(gpt_concat, lambda e: solo(e, reqs))
    for options in ({}, {"max_running": 3}):  # rows join a running batch and leave it at every length
        shared = run_engine(gpt, lambda e: staggered(e, reqs), **options)
        check_outputs_equal(
            [(r.token_ids, r.text, r.finish_reason) for r in shared],
            [(r.token_ids, r.text, r.finish_reason) for r in concat_alone],
            name_a=f"in place, staggered {options}",
            name_b="Concat, alone",
        )
    if kind == "greedy":  # and both are the plain definition of the model
        prompts = [r.prompt_ids for r in reqs]
        for req, result in zip(reqs, concat_alone, strict=True):
            want = recompute(gpt, [req.prompt_ids], [GREEDY], len(result.token_ids))[0]
            assert result.token_ids == want, f"prompt {prompts.index(req.prompt_ids)}"


def test_a_row_reaching_the_buffer_end_finishes_with_length(
    gpt: LoadedModel, gpt_concat: LoadedModel
) -> None:
    context = required(gpt.manifest.max_sequence_length)
    long_prompt = encode(gpt, PROMPTS[7] * 3)[: context - 3]  # 3 positions left
    short = encode(gpt, PROMPTS[1])

    async def scenario(engine) -> list[GenerationResult]:  # type: ignore[no-untyped-def]
        streams = [
            engine.submit(GenerationRequest(long_prompt, replace(sampled(1), max_new_tokens=50))),
            engine.submit(GenerationRequest(short, replace(sampled(2), max_new_tokens=20))),
        ]
        return list(await asyncio.gather(*(s.result() for s in streams)))

    ended, other = run_engine(gpt, scenario)
    assert ended.finish_reason == "length" and ended.completion_tokens == 3
    want = run_engine(gpt_concat, scenario)
    check_outputs_equal(
        [(r.token_ids, r.finish_reason) for r in (ended, other)],
        [(r.token_ids, r.finish_reason) for r in want],
        name_a="in place",
        name_b="Concat",
    )
    assert len(other.token_ids) > 3, "the other row went on after the first one left at the buffer's end"


# --- the translator's decoder ---------------------------------------------------------------


@pytest.fixture(scope="module")
def translators(tiny_models: Path, data_dir: Path) -> tuple[LoadedModel, LoadedModel, list[list[int]]]:
    from model_export.data import load_multi30k

    inplace = load_model(tiny_models / "translator", RuntimeOptions(device="cpu"))
    concat = load_model(tiny_models / "translator", RuntimeOptions(device="cpu", kv_cache="concat"))
    assert inplace.tokenizer is not None
    english = [en for en, _ in load_multi30k(data_dir, "validation")[:6]]
    cap = seq2seq(inplace).max_new_tokens  # the served sources; the step limits are each test's own
    sources = [
        prepare_source(inplace.manifest, e.ids, cap)[0] for e in inplace.tokenizer.encode_batch(english)
    ]
    return inplace, concat, sources


def seq2seq(model: LoadedModel) -> Seq2SeqModel:
    return Seq2SeqModel(
        model.graphs["encoder"], model.graphs["decoder"], model.manifest, model.inplace.get("decoder")
    )


def test_buffers_of_other_lengths_in_turn(translators: tuple) -> None:
    # Each call's buffer is as long as its step limit; a new one may reuse the last one's memory, so
    # the step graph's binding must follow the shape as well as the address.
    inplace, concat, sources = translators
    ours, theirs = seq2seq(inplace), seq2seq(concat)
    for limit in (20, 21, 20, 33, 21, 20):
        for rows in (sources[:1], sources[:3]):
            got = [(h.tokens, h.finished) for h in ours.greedy(rows, limit)]
            want = [(h.tokens, h.finished) for h in theirs.greedy(rows, limit)]
            assert got == want, f"limit {limit}, {len(rows)} row(s)"


def test_translator_decoder_has_an_in_place_step(translators: tuple, tiny_models: Path) -> None:
    inplace, concat, _ = translators
    assert set(inplace.inplace) == {"decoder"} and seq2seq(inplace).in_place
    assert concat.inplace == {} and not seq2seq(concat).in_place
    record = json.loads((tiny_models / "translator" / "manifest.json").read_text())["variants"]["fused"]
    assert record["inplace_max_abs_diff"] <= 1e-5


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translations_in_place_equal_concat(translators: tuple, beam_size: int) -> None:
    inplace, concat, sources = translators

    def translate(model: LoadedModel) -> list:
        s2s = seq2seq(model)
        if beam_size == 1:  # rows of different lengths leave the batch as they finish
            return [(h.tokens, h.finished) for h in s2s.greedy(sources, 40)]
        return [[(h.tokens, h.finished) for h in hyps] for hyps in s2s.beam_search(sources, 4, 40, 1.0, 2)]

    check_outputs_equal(translate(inplace), translate(concat), name_a="in place", name_b="Concat")


# --- what the service says ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inplace", "concat"])
def test_models_endpoint_says_how_the_decoders_grow_their_cache(model_repo: Path, mode: str) -> None:
    settings = Settings(MODEL_REPOSITORY=model_repo, DEVICE="cpu", KV_CACHE=mode, CACHE_ENABLED=False)
    with LiveServer(settings) as server:
        models = {m["name"]: m for m in httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]}
        assert models["gpt"]["kv_cache"] == mode and models["translator"]["kv_cache"] == mode
        assert models["bert-classifier"]["kv_cache"] is None
        answer = httpx.post(
            f"{server.url}/v1/generate",
            json={"prompt": PROMPTS[2], "max_new_tokens": 12, "temperature": 0},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert 1 <= answer.json()["results"][0]["completion_tokens"] <= 12
