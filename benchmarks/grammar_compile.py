"""Compiling structured-output constraints: the time and peak memory of the largest ones the bounds accept,
and what a refused one costs, on the served GPT's vocabulary.

Each case runs in a fresh process (so its peak resident memory is its own, over the process with the
tokenizer loaded): ``GrammarCompiler.compile``, the service's own check (the bounds, llguidance's
validation, the matcher, its first mask and the walk of forced tokens), on the deep-stack compile
threads. Cases: the deepest Lark grammar accepted (a chain of MAX_GRAMMAR_RULES - 1 rules), the deepest
JSON schema within MAX_SPEC_CHARS (a chain of ``$ref`` objects, each holding the next), MAX_CHOICES
choices filling MAX_SPEC_CHARS, ``a{100000}`` (a first mask that takes a while); and refused: a 3,000-rule
chain and 100,000 choices (the bounds, before any compiling), ``a{1000000}`` (llguidance's lexer limit,
found by the walk of forced tokens), a ``$ref`` cycle. A refusal is cached like a compiled constraint:
the figure is its first cost. The peak is over the process's high-water mark once the tokenizer is
loaded (0: under it). Run as ``python -m benchmarks.grammar_compile --models models/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Result
from service.engine.structured_output import MAX_CHOICES, MAX_GRAMMAR_RULES, MAX_SPEC_CHARS

NAME = "grammar_compile"
TITLE = "(g) Grammar compilation: the largest constraints accepted, and what a refused one costs"

CHILD = r"""
import json, resource, sys, time
from tokenizers import Tokenizer
from service.engine.structured_output import GrammarCompiler, GrammarError, StructuredOutput
folder, case = sys.argv[1], json.load(open(sys.argv[2]))
manifest = json.load(open(folder + "/manifest.json"))
tokenizer = Tokenizer.from_file(folder + "/tokenizer.json")
vocab = int(manifest.get("config", {}).get("vocab_size") or tokenizer.get_vocab_size())
compiler = GrammarCompiler(tokenizer, vocab, 0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    compiler.compile(StructuredOutput(case["kind"], case["spec"]))
    outcome = "accepted"
except GrammarError as exc:
    outcome = "refused: " + str(exc)[:90]
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_mib": (after - before) / 1024, "outcome": outcome, "vocab": vocab}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=None, help="fresh processes per case (default 3)")


def chain(rules: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules - 1)) + f'r{rules - 1}: "a"\n'


def ref_chain(levels: int) -> str:
    defs: dict[str, Any] = {
        f"d{i}": {"properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["a"]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"enum": ["x"]}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs}, separators=(",", ":"))


def deepest_ref_chain() -> tuple[int, str]:
    levels = 1
    while len(ref_chain(levels * 2)) <= MAX_SPEC_CHARS:
        levels *= 2
    step = levels // 2
    while step:
        if len(ref_chain(levels + step)) <= MAX_SPEC_CHARS:
            levels += step
        step //= 2
    return levels, ref_chain(levels)


def cases() -> list[tuple[str, str, str]]:
    levels, schema = deepest_ref_chain()
    width = (MAX_SPEC_CHARS - 4 * MAX_CHOICES) // MAX_CHOICES  # json.dumps: two quotes and ", " each
    choices = [f"{i:04d}" + "x" * (width - 4) for i in range(MAX_CHOICES)]
    cycle = {"$ref": "#/$defs/x", "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}}
    return [
        (f"Lark chain of {MAX_GRAMMAR_RULES - 1} rules", "grammar", chain(MAX_GRAMMAR_RULES - 1)),
        (f"JSON schema, $ref chain of {levels} objects", "json", schema),
        (f"{MAX_CHOICES} choices of {width} characters", "choice", json.dumps(choices)),
        ("regex a{100000}", "regex", "a{100000}"),
        ("Lark chain of 3000 rules", "grammar", chain(3000)),
        ("100,000 choices", "choice", json.dumps([f"c{i}" for i in range(100_000)])),
        ("regex a{1000000}", "regex", "a{1000000}"),
        ("JSON schema, $ref cycle", "json", json.dumps(cycle)),
    ]


def measure(folder: Path, kind: str, spec: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"kind": kind, "spec": spec}, f)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(folder), f.name], capture_output=True, text=True, timeout=600
        )
    finally:
        Path(f.name).unlink()
    if done.returncode != 0:
        return {
            "seconds": float("nan"),
            "peak_mib": float("nan"),
            "outcome": f"died (exit {done.returncode})",
        }
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-generation")
    repeat = opts.extra.get("repeat") or (1 if opts.quick else 3)
    rows = [
        f"Model `{folder.name}`'s vocabulary; bounds: MAX_SPEC_CHARS {MAX_SPEC_CHARS}, MAX_CHOICES "
        f"{MAX_CHOICES}, MAX_GRAMMAR_RULES {MAX_GRAMMAR_RULES}; {repeat} fresh process(es) per case, the "
        "median time and the largest peak.",
        "",
        "| constraint | characters | outcome | compile + first mask (ms) | peak memory over the tokenizer (MiB) |",
        "|---|---|---|---|---|",
    ]
    metrics: dict[str, Any] = {}
    for label, kind, spec in cases():
        runs = [measure(folder, kind, spec) for _ in range(repeat)]
        seconds = sorted(r["seconds"] for r in runs)[len(runs) // 2]
        peak = max(r["peak_mib"] for r in runs)
        outcome = runs[0]["outcome"].replace("|", "/")
        rows.append(f"| {label} | {len(spec)} | {outcome} | {seconds * 1000:.1f} | {peak:.1f} |")
        metrics[label] = {"seconds": seconds, "peak_mib": peak, "outcome": outcome, "chars": len(spec)}
    return Result(NAME, TITLE, metrics, [], rows)


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
