"""Generation features against the plain path, side by side in one run, in process on the served GPT:

(a) structured output: what a grammar mask costs per step. llguidance (the service's) and xgrammar
    (measured when importable: its wheel requires torch, transformers and triton, so it lives in a venv
    of its own, never the service's) walk the same JSON schema on the model's vocabulary, one mask per
    token; then the engine decodes 16 sequences, all free, against 8 free + 8 constrained (an open regex
    and a JSON schema, so no sequence ends early), and the mean step time of each is compared.
(b) automatic prefix caching: time to first token of requests that share a 192-token prefix, the cache
    on against off, taking turns; the tokens generated must be the same.
(c) n-gram (prompt lookup) speculation: tokens/s of greedy decoding on a task that copies its input (a
    passage, then its start again), speculation on against off, taking turns; the output must be the same,
    and the acceptance rate is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/generation_features.py`

import numpy as np

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Check, Result
from harness.stats import median, ratio
from service.engine.continuous_batching import GenerationEngine
from service.engine.generation_contract import GenerationRequest, NullGenerationObserver
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import SamplingParams
from service.engine.speculation import Speculation
from service.engine.structured_output import GrammarCompiler, StructuredOutput

NAME = "generation_features"
TITLE = "(k) Generation features: grammar masks, prefix caching, n-gram speculation"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "lines": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
        "mood": {"enum": ["merry", "sad", "wroth"]},
    },
    "required": ["name", "age", "lines", "mood"],
    "additionalProperties": False,
}
OPEN_SCHEMA = {"type": "object", "properties": {"speech": {"type": "string"}}, "required": ["speech"]}
TARGET_MASKED_STEP = 0.8  # a step with 8 of 16 rows constrained runs at >= 0.8x the free step's speed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="turns per side (default 5, quick 1)")


# --- (a) grammar masks ------------------------------------------------------------------------------


def llguidance_walk(model: LoadedModel, steps: int, seed: int) -> tuple[float, list[float]]:
    """Compile SCHEMA, then ``steps`` masks of a random walk inside it: (compile s, per-mask seconds)."""
    assert model.tokenizer is not None
    vocab = int(model.manifest.config.get("vocab_size") or model.tokenizer.get_vocab_size())
    compiler = GrammarCompiler(model.tokenizer, vocab, model.manifest.token("eos"))
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    grammar = compiler.start(StructuredOutput.json_schema(SCHEMA))
    compiled = time.perf_counter() - started
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        (allowed,) = compiler.masks([grammar])
        times.append(time.perf_counter() - started)
        token = int(rng.choice(np.flatnonzero(allowed)))
        if token == model.manifest.token("eos"):
            break
        grammar.consume(token)
        if grammar.finished:
            break
    return compiled, times


def xgrammar_walk(model: LoadedModel, steps: int, seed: int) -> tuple[float, list[float]] | str:
    """The same walk with xgrammar, or why it was not measured."""
    try:
        import xgrammar as xgr  # type: ignore[import-not-found]
        from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]
    except ImportError as exc:
        return f"not importable here ({exc.name}); run under a venv with xgrammar (it requires torch)"
    assert model.tokenizer is not None
    vocab = int(model.manifest.config.get("vocab_size") or model.tokenizer.get_vocab_size())
    eos = model.manifest.token("eos")
    hf = PreTrainedTokenizerFast(tokenizer_object=model.tokenizer, eos_token=model.tokenizer.id_to_token(eos))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    compiled_grammar = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": ")
    )
    matcher = xgr.GrammarMatcher(compiled_grammar)
    compiled = time.perf_counter() - started
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask.numpy()
        times.append(time.perf_counter() - started)
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[0, :vocab].astype(bool)
        token = int(rng.choice(np.flatnonzero(bits)))
        if token == eos:
            break
        matcher.accept_token(token)
        if matcher.is_terminated():
            break
    return compiled, times


# Schema keywords whose support differs; each with a text that breaks it (what an engine that "compiles" the
# keyword by ignoring it lets through).
KEYWORDS: dict[str, tuple[dict[str, Any], str]] = {
    "not": ({"not": {"type": "string"}}, '"abc"'),
    "if / then": ({"if": {"type": "string"}, "then": {"minLength": 2}}, '"a"'),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    "minProperties": ({"type": "object", "minProperties": 1}, "{}"),
    "recursive $ref": (
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                }
            },
            "$ref": "#/$defs/n",
        },
        "[]",
    ),
    "pattern": ({"type": "string", "pattern": "^[A-Z][a-z]+$"}, '"x"'),
    "format: email": ({"type": "string", "format": "email"}, '"x"'),
}


def keyword_support(model: LoadedModel) -> list[str]:
    """Which schema keywords each engine compiles, and whether what it compiles lets a breaking text end."""
    assert model.tokenizer is not None
    vocab = int(model.manifest.config.get("vocab_size") or model.tokenizer.get_vocab_size())
    eos = model.manifest.token("eos")
    compiler = GrammarCompiler(model.tokenizer, vocab, eos)
    try:
        import xgrammar as xgr  # type: ignore[import-not-found]
        from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

        hf = PreTrainedTokenizerFast(
            tokenizer_object=model.tokenizer, eos_token=model.tokenizer.id_to_token(eos)
        )
        xcompiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
        )
    except ImportError:
        xcompiler = None
    rows = ["| schema keyword | llguidance | xgrammar |", "|---|---|---|"]
    for name, (schema, breaking) in KEYWORDS.items():
        try:
            compiler.compile(StructuredOutput.json_schema(schema))
            ours = "compiles"
        except ValueError as exc:
            ours = f"refused (400: {str(exc)[:50]})"
        theirs = "not measured"
        if xcompiler is not None:
            try:
                matcher = xgr.GrammarMatcher(xcompiler.compile_json_schema(json.dumps(schema)))
                lets = matcher.accept_string(breaking) and matcher.accept_token(eos)
                theirs = f"compiles, and lets `{breaking}` through" if lets else "compiles"
            except Exception:
                theirs = "refused"
        rows.append(f"| {name} | {ours} | {theirs} |")
    return rows


def masked_steps(model: LoadedModel, rounds: int, tokens: int) -> dict[str, float]:
    """Mean seconds per engine step: 16 free rows against 8 free + 8 constrained, taking turns."""
    assert model.tokenizer is not None
    prompt = list(model.tokenizer.encode("ROMEO:\n").ids)
    constraints = [StructuredOutput("regex", "[a-z ,.;]+"), StructuredOutput.json_schema(OPEN_SCHEMA)]

    def requests(constrained: bool) -> list[GenerationRequest]:
        out = []
        for i in range(16):
            structured = constraints[i % 2] if constrained and i >= 8 else None
            params = SamplingParams(
                max_new_tokens=tokens, temperature=0.8, seed=i, structured_outputs=structured
            )
            out.append(GenerationRequest(prompt, params))
        return out

    class Steps(NullGenerationObserver):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step(self, batch_size: int, seconds: float) -> None:
            if batch_size == 16:
                self.seconds.append(seconds)

    async def compare() -> dict[str, float]:
        """One engine per side, kept; the 16 requests on one then the other, ``2 * rounds`` times."""
        steps = {"free": Steps(), "masked": Steps()}
        engines = {
            side: GenerationEngine(
                model, max_running=16, max_queue_size=64, queue_timeout_s=600, observer=obs
            )
            for side, obs in steps.items()
        }
        for engine in engines.values():
            await engine.start()
        try:
            means: dict[str, list[float]] = {"free": [], "masked": []}
            for turn in range(-1, 2 * rounds):  # turn -1: warm-up (compiles, allocations)
                for side, engine in engines.items():
                    steps[side].seconds.clear()
                    streams = engine.submit_all(requests(side == "masked"))
                    await asyncio.gather(*(s.result() for s in streams))
                    if turn >= 0:
                        means[side].append(statistics.mean(steps[side].seconds))
            batch = engines["masked"]._batch
            counted = 2 * rounds + 1  # masked runs, each of ``tokens`` steps
        finally:
            for engine in engines.values():
                await engine.stop(timeout_s=60)
        return {
            "free_step_ms": median(means["free"]) * 1e3,
            "masked_step_ms": median(means["masked"]) * 1e3,
            "mask_ms_per_step": batch.mask_seconds / (counted * tokens) * 1e3,
            "mask_wait_ms_per_step": batch.mask_wait_seconds / (counted * tokens) * 1e3,
        }

    return asyncio.run(compare())


def grammar_part(model: LoadedModel, rounds: int, quick: bool) -> tuple[dict[str, Any], list[str], Check]:
    steps = 60 if quick else 400
    compiled, times = llguidance_walk(model, steps, 0)
    metrics: dict[str, Any] = {
        "llguidance_compile_ms": compiled * 1e3,
        "llguidance_mask_us_median": median(times) * 1e6,
        "llguidance_mask_us_mean": statistics.mean(times) * 1e6,
        "llguidance_masks": len(times),
    }
    rows = [
        "| grammar engine | compile (ms) | masks | mask median (µs) | mask mean (µs) | mask p99 (µs) |",
        "|---|---|---|---|---|---|",
        f"| llguidance | {compiled * 1e3:.2f} | {len(times)} | {median(times) * 1e6:.1f} | "
        f"{statistics.mean(times) * 1e6:.1f} | {np.percentile(times, 99) * 1e6:.1f} |",
    ]
    xgr = xgrammar_walk(model, steps, 0)
    if isinstance(xgr, str):
        rows.append(f"| xgrammar | {xgr} | | | | |")
    else:
        x_compiled, x_times = xgr
        metrics.update(
            xgrammar_compile_ms=x_compiled * 1e3,
            xgrammar_mask_us_median=median(x_times) * 1e6,
            xgrammar_mask_us_mean=statistics.mean(x_times) * 1e6,
        )
        rows.append(
            f"| xgrammar | {x_compiled * 1e3:.2f} | {len(x_times)} | {median(x_times) * 1e6:.1f} | "
            f"{statistics.mean(x_times) * 1e6:.1f} | {np.percentile(x_times, 99) * 1e6:.1f} |"
        )
    rows += ["", *keyword_support(model)]
    engine = masked_steps(model, rounds, 12 if quick else 48)
    metrics.update(engine)
    speed = ratio(engine["free_step_ms"], engine["masked_step_ms"])
    metrics["masked_step_speed"] = speed
    rows += [
        "",
        f"Engine, 16 rows: a free step {engine['free_step_ms']:.2f} ms, with 8 rows constrained "
        f"{engine['masked_step_ms']:.2f} ms (**{speed:.2f}x** the free step's speed); the masks took "
        f"{engine['mask_ms_per_step']:.3f} ms per step in all, of which the step waited "
        f"{engine['mask_wait_ms_per_step']:.3f} ms (on CPU the masks are computed right before the model "
        "call, all of it; on CUDA beside it).",
    ]
    return metrics, rows, Check("8 of 16 rows constrained: step speed vs free", speed, TARGET_MASKED_STEP)


# --- (b) prefix caching ------------------------------------------------------------------------------

PREFIX_TOKENS = 192
PASSAGE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\n"
    "You are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\nFirst Citizen:\n"
    "First, you know Caius Marcius is chief enemy to the people.\n\nAll:\nWe know't, we know't.\n\n"
    "First Citizen:\nLet us kill him, and we'll have corn at our own price.\nIs't a verdict?\n\nAll:\n"
    "No more talking on't; let it be done: away, away!\n\nSecond Citizen:\nOne word, good citizens.\n\n"
    "First Citizen:\nWe are accounted poor citizens, the patricians good.\nWhat authority surfeits on would "
    "relieve us: if they\nwould yield us but the superfluity, while it were\nwholesome, we might guess they "
    "relieved us humanely;\nbut they think we are too dear: the leanness that\nafflicts us, the object of "
    "our misery, is as an\ninventory to particularise their abundance; our\nsufferance is a gain to them "
    "Let us revenge this with\nour pikes, ere we become rakes: for the gods know I\nspeak this in hunger "
    "for bread, not in thirst for revenge.\n\n"
)
QUESTIONS = [
    "MENENIUS:\nWhat work's, my countrymen, in hand?",
    "Second Citizen:\nWould you proceed especially against Caius Marcius?",
    "All:\nAgainst him first: he's a very dog to the commonalty.",
    "Second Citizen:\nConsider you what services he has done for his country?",
    "First Citizen:\nVery well; and could be content to give him good report fort.",
    "MARCIUS:\nThanks. What's the matter, you dissentious rogues,",
    "COMINIUS:\nWhere is your ancient courage? you were used to say",
    "VOLUMNIA:\nI pray you, daughter, sing; or express yourself",
]


def prefix_part(model: LoadedModel, rounds: int, quick: bool) -> tuple[dict[str, Any], list[str], Check]:
    """Time to first token of requests sharing a PREFIX_TOKENS-token prefix, the prefix cache on and off."""
    assert model.tokenizer is not None
    context = int(model.manifest.max_sequence_length or 0)
    shared_len = min(PREFIX_TOKENS, context // 2) if quick or context < PREFIX_TOKENS + 48 else PREFIX_TOKENS
    shared = list(model.tokenizer.encode(PASSAGE * 4).ids)[:shared_len]
    tails = [list(model.tokenizer.encode(q).ids)[:16] for q in QUESTIONS]
    prompts = [shared + tail for tail in tails]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0, repetition_penalty=1.3)

    async def first_token(engine: GenerationEngine, prompt: list[int]) -> tuple[float, list[int]]:
        started = time.perf_counter()
        stream = engine.submit(GenerationRequest(prompt, greedy))
        first = None
        async for _ in stream:  # to the end: leaving the iteration would cancel the sequence
            first = first if first is not None else time.perf_counter() - started
        assert first is not None
        return first, (await stream.result()).token_ids

    async def compare() -> tuple[list[float], list[float], bool]:
        """One engine per side, kept; each prompt on one then the other, ``rounds`` times over."""
        plain = GenerationEngine(model, max_running=16, max_queue_size=64, queue_timeout_s=600)
        cached = GenerationEngine(
            model, max_running=16, max_queue_size=64, queue_timeout_s=600, prefix_cache_bytes=64 << 20
        )
        await plain.start()
        await cached.start()
        try:
            for engine in (plain, cached):  # warm-up, and the prefix stored
                await first_token(engine, [*shared, tails[0][0]])
            off, on, same = [], [], True
            for _ in range(rounds):
                for prompt in prompts:
                    seconds, a = await first_token(plain, prompt)
                    off.append(seconds)
                    seconds, b = await first_token(cached, prompt)
                    on.append(seconds)
                    same = same and a == b
            return off, on, same
        finally:
            await plain.stop(timeout_s=60)
            await cached.stop(timeout_s=60)

    off, on, same = asyncio.run(compare())
    speedup = ratio(median(off), median(on))
    metrics = {
        "prefix_shared_tokens": shared_len,
        "prefix_ttft_ms_off": median(off) * 1e3,
        "prefix_ttft_ms_on": median(on) * 1e3,
        "prefix_cache_ttft_speedup": speedup,
        "prefix_same_tokens": same,
    }
    rows = [
        "| prefix cache | requests | TTFT p50 (ms) | TTFT p95 (ms) |",
        "|---|---|---|---|",
        f"| off | {len(off)} | {median(off) * 1e3:.2f} | {np.percentile(off, 95) * 1e3:.2f} |",
        f"| on | {len(on)} | {median(on) * 1e3:.2f} | {np.percentile(on, 95) * 1e3:.2f} |",
        "",
        f"{len(prompts)} prompts of a shared {shared_len}-token prefix and a 16-token question each, one at a "
        f"time after one request stored the prefix; one engine per side, kept, each prompt on one then the "
        f"other, {rounds} time(s) over; greedy, 4 new tokens. TTFT "
        f"**{speedup:.2f}x** faster with the cache; the tokens generated "
        + ("are the same." if same else "DIFFER."),
    ]
    return metrics, rows, Check(f"prefix cache TTFT speedup, {shared_len}-token shared prefix", speedup, 3.0)


# --- (c) n-gram speculation -----------------------------------------------------------------------------

COPY_PASSAGE_TOKENS = 80
COPY_NEW_TOKENS = 96
TARGET_SPECULATION = 1.5


def speculation_part(model: LoadedModel, rounds: int, quick: bool) -> tuple[dict[str, Any], list[str], Check]:
    """Greedy tokens/s on a copying task, speculation on (k tokens, n-grams 3..1) against off: one engine per
    side, kept, the same request on each in turn, ``4 * rounds`` times."""
    assert model.tokenizer is not None
    context = int(model.manifest.max_sequence_length or 0)
    passage_len = min(COPY_PASSAGE_TOKENS, context // 4)
    new = min(COPY_NEW_TOKENS, context - 2 * passage_len - 8)
    passage = list(model.tokenizer.encode(PASSAGE).ids)[:passage_len]
    prompts = [
        passage + passage + passage[:8],
        *(passage[i:] + passage + passage[: i + 8] for i in (8, 16, 24)),
    ]
    turns = 4 * rounds

    async def compare(k: int, rows: int) -> dict[str, Any]:
        # measured at 8 rows too: the default SPECULATIVE_NGRAM_MAX_ROWS (4) leaves such a batch unspeculated
        spec = Speculation(tokens=k, max_n=3, min_n=1, max_rows=16)
        plain = GenerationEngine(model, max_running=16, max_queue_size=64, queue_timeout_s=600)
        guessing = GenerationEngine(
            model, max_running=16, max_queue_size=64, queue_timeout_s=600, speculation=spec
        )
        reqs = [
            GenerationRequest(prompts[i % len(prompts)], SamplingParams(max_new_tokens=new, temperature=0.0))
            for i in range(rows)
        ]

        async def once(engine: GenerationEngine) -> tuple[float, list[list[int]]]:
            started = time.perf_counter()
            results = await asyncio.gather(*(s.result() for s in engine.submit_all(reqs)))
            seconds = time.perf_counter() - started
            return sum(r.completion_tokens for r in results) / seconds, [r.token_ids for r in results]

        await plain.start()
        await guessing.start()
        try:
            await once(plain)  # warm-up: buffers, bindings
            await once(guessing)
            proposed0, accepted0 = guessing._batch.proposed_tokens, guessing._batch.accepted_tokens
            off, on, same = [], [], True
            for _ in range(turns):
                rate, a = await once(plain)
                off.append(rate)
                rate, b = await once(guessing)
                on.append(rate)
                same = same and a == b
            proposed = guessing._batch.proposed_tokens - proposed0
            accepted = guessing._batch.accepted_tokens - accepted0
        finally:
            await plain.stop(timeout_s=60)
            await guessing.stop(timeout_s=60)
        return {
            "off": median(off),
            "on": median(on),
            "proposed": proposed,
            "accepted": accepted,
            "same": same,
        }

    metrics: dict[str, Any] = {"copy_new_tokens": new, "copy_passage_tokens": passage_len}
    rows_out = [
        "| rows | k | off (tokens/s) | on (tokens/s) | speedup | proposed | accepted | acceptance | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rows, k in ((1, 4), (1, 8), (8, 4)):
        got = asyncio.run(compare(k, rows))
        speedup = ratio(got["on"], got["off"])
        rate = got["accepted"] / got["proposed"] if got["proposed"] else 0.0
        metrics[f"ngram_speculation_speedup_{rows}_k{k}"] = speedup
        metrics[f"ngram_acceptance_rate_{rows}_k{k}"] = rate
        metrics[f"ngram_same_tokens_{rows}_k{k}"] = got["same"]
        rows_out.append(
            f"| {rows} | {k} | {got['off']:.0f} | {got['on']:.0f} | **{speedup:.2f}x** | {got['proposed']} | "
            f"{got['accepted']} | {rate:.0%} | {'yes' if got['same'] else 'NO'} |"
        )
    headline = float(metrics["ngram_speculation_speedup_1_k4"])
    metrics["ngram_speculation_speedup"] = headline
    plain_engine = GenerationEngine(model, max_running=1, max_queue_size=4, queue_timeout_s=600)

    async def sample() -> tuple[str, int]:
        """The first prompt's continuation, and how many of its tokens continue the passage (copy it)."""
        await plain_engine.start()
        try:
            result = await plain_engine.submit(
                GenerationRequest(prompts[0], SamplingParams(max_new_tokens=new, temperature=0.0))
            ).result()
        finally:
            await plain_engine.stop(timeout_s=60)
        expected = passage[8:]
        copied = next(
            (i for i, (a, b) in enumerate(zip(result.token_ids, expected, strict=False)) if a != b),
            min(len(expected), len(result.token_ids)),
        )
        return result.text, copied

    text, copied = asyncio.run(sample())
    metrics["copy_tokens_copied"] = copied

    rows_out += [
        "",
        f"Greedy, {new} new tokens per sequence; prompts: an {passage_len}-token passage twice and the start of "
        "a third (four rotations), so the text copies its input. Speculation proposes up to k tokens from the "
        f"latest earlier 3-, 2- or 1-gram; one engine per side, the same request on each in turn, {turns} "
        "times; medians. At 8 rows, SPECULATIVE_NGRAM_MAX_ROWS is raised to 16 (its default, 4, leaves such a "
        f"batch unspeculated). The first prompt's continuation begins {text[:24]!r}: it continues the passage "
        f"for {copied} token(s)"
        + (
            ", then repeats its own output, which the n-gram proposals find as well: this model does not copy "
            "its input, so the figure is that of a text that repeats itself."
            if copied < new // 2
            else "."
        ),
    ]
    return (
        metrics,
        rows_out,
        Check("n-gram speculation, copying task, 1 sequence, k 4: tokens/s", headline, TARGET_SPECULATION),
    )


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-generation")
    model = load_model(folder, RuntimeOptions(device=opts.device, intra_op_threads=opts.threads))  # type: ignore[arg-type]
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 5)
    metrics: dict[str, Any] = {"provider": model.provider, "variant": model.variant.name, "rounds": rounds}
    details = [
        f"Model `{folder.name}` ({model.variant.name} graphs, {model.provider}), {rounds} round(s) per side.",
        "",
    ]
    checks: list[Check] = []
    parts: list[Callable[[LoadedModel, int, bool], tuple[dict[str, Any], list[str], Check]]] = [
        grammar_part,
        prefix_part,
        speculation_part,
    ]
    for part in parts:
        figures, rows, check = part(model, rounds, opts.quick)
        metrics.update(figures)
        details += [*rows, ""]
        checks.append(check)
    return Result(NAME, TITLE, metrics, checks, details, {"provider": model.provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
