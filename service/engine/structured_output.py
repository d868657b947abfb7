"""Structured output: a grammar that every generated token must keep the text inside of.

A request asks for one constraint (``StructuredOutput``): a JSON schema, any JSON object, a
regular expression, one of several strings, or a Lark grammar. ``GrammarCompiler`` (one per
model, built from its tokenizer) turns it into an llguidance grammar, checked once per request so
that a constraint the engine cannot compile is the client's error before anything is queued.
Each constrained sequence then holds a ``Grammar`` (an ``llguidance.LLMatcher``): before a token
is picked, the tokens that keep the text inside the grammar (one bit each: the mask); after it,
the token is consumed. The end of text is allowed only where the grammar accepts, and a grammar
that can take no further token ends its sequence (``finish_reason`` stop).

Masks for every constrained row of a step are computed together, in one call to llguidance's
executor (``fill_next_token_bitmask_par``: Rust threads, the GIL released), so constrained and free
sequences share every step. A token's mask depends only on the tokens before it, known before the
step starts, so on CUDA the masks are computed on another thread while the model runs; on CPU,
where ONNX Runtime's threads already take every core, right before it (``RunningBatch``).

Why llguidance and not xgrammar (``benchmarks/generation_features.py``): both compute masks from the
tokenizer's vocabulary in microseconds per step (xgrammar faster: about 2 µs against 20 µs at the
median on the GPT's 2048 tokens), but xgrammar's wheel requires torch, transformers and triton, which
the service must not install; and a schema keyword llguidance cannot enforce (``not``, ``if``/``then``,
``uniqueItems``) it refuses, so the client gets a 400 naming it, where xgrammar compiles the schema
without the keyword and lets through text that breaks it.

Bounds, checked before anything is compiled (``check_bounds``: a ``GrammarError``, the client's 400):
a constraint's text at most ``MAX_SPEC_CHARS``, a choice among at most ``MAX_CHOICES`` strings, a Lark
grammar of at most ``MAX_GRAMMAR_RULES`` rules and terminals. llguidance compiles recursively, about
3 KB of stack per level of rules (a chain of 2,650 rules overflows a thread's usual 8 MiB: SIGSEGV, the
whole process gone), so compiling, the matcher and its first mask run on threads of their own with a
``COMPILE_STACK_BYTES`` stack: the deepest constraint the bounds let through (measured:
``benchmarks/grammar_compile.py``) uses under a tenth of it. llguidance's limits (``LIMITS``) bound the
rest; its errors are terse (``verbose_errors`` off: no grammar dump) and nothing of a constraint is
logged. Compiling and the first mask (seconds for ``a{1000000}``) are done before the sequence is
admitted to the running batch (``GrammarCompiler.prepare``), so they never stall the decoding loop.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par
from tokenizers import Tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = [
    "MAX_CHOICES",
    "MAX_GRAMMAR_RULES",
    "MAX_SPEC_CHARS",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "StructuredOutput",
    "check_bounds",
    "masks_to_allowed",
]

T = TypeVar("T")

Kind = Literal["json", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json", "json_object", "regex", "choice", "grammar")
ANY_OBJECT = '{"type": "object"}'
# JSON is written as Python's json.dumps writes it (", " and ": ", no other whitespace), not with the free
# whitespace JSON allows: a small model wanders into whitespace forever (vLLM's disable_any_whitespace).
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
MAX_CHOICES = 256  # strings in a choice, on every door
MAX_SPEC_CHARS = 65_536  # characters of a constraint's text: the schema, regex, choices or grammar
MAX_GRAMMAR_RULES = 1_000  # rules and terminals of a Lark grammar: its depth is at most this
# A compile thread's stack: the deepest constraint under the bounds needs about 14 MiB (a $ref chain of 1,550
# arrays in 64 KiB, ~8.5 KB a level; a thread's usual 8 MiB overflows at ~900 levels); only pages used are touched.
COMPILE_STACK_BYTES = 256 * 2**20
COMPILE_THREADS = 2
# llguidance's defaults, and terse errors: a verbose one dumps the grammar (the client's schema).
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
FORCED_PROBE = 8  # forced tokens walked when compiling, to refuse a constraint that fails on its only path
MAX_ERROR_CHARS = 300  # of llguidance's message, in the client's 400
# A Lark definition: a rule or terminal name at the start of a line, then ":" (priorities and ?/! allowed).
_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?[0-9]+)?[ \t]*:", re.MULTILINE)


@dataclass(frozen=True)
class StructuredOutput:
    """One constraint on a generation (vLLM's ``StructuredOutputsParams``, one field set).

    ``spec`` is text: the JSON schema (serialised), the regex, the JSON list of choices, or the Lark
    grammar; ``json_object`` takes none.
    """

    kind: Kind
    spec: str = ""
    field: str = field(default="structured_outputs", compare=False)  # the client's name, for its errors

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"unknown structured output kind {self.kind!r}"

    @classmethod
    def json_schema(cls, schema: Any, field: str = "structured_outputs") -> StructuredOutput:
        """A schema given as an object or as its JSON text (its properties in the order given: the order
        they are written in)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json", text, field)

    @classmethod
    def choice(cls, choices: Sequence[str], field: str = "structured_outputs") -> StructuredOutput:
        return cls("choice", json.dumps(list(choices)), field)


class GrammarError(ValueError):
    """A constraint the grammar engine cannot compile; the message says which part it refused."""


def check_bounds(structured: StructuredOutput) -> None:
    """The bounds every door shares, before anything is compiled: GrammarError naming the one exceeded."""
    if structured.kind == "choice":
        choices = json.loads(structured.spec)
        if isinstance(choices, list) and len(choices) > MAX_CHOICES:
            raise GrammarError(f"at most {MAX_CHOICES} choices, got {len(choices)}")
    if len(structured.spec) > MAX_SPEC_CHARS:
        raise GrammarError(f"the constraint is {len(structured.spec)} characters, at most {MAX_SPEC_CHARS}")
    if structured.kind == "grammar":
        rules = sum(1 for _ in _DEFINITION.finditer(structured.spec))
        if rules > MAX_GRAMMAR_RULES:
            raise GrammarError(
                f"the grammar defines {rules} rules and terminals, at most {MAX_GRAMMAR_RULES}"
            )


def _terse(message: str) -> str:
    """llguidance's message for the client: without its non-verbose marker, bounded."""
    text = message.replace("<non-verbose/>", "").strip() or "the grammar engine refused it"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


_STACK_SIZE = threading.Lock()  # threading.stack_size is process-wide: set only around a thread's start


class _DeepStackPool:
    """Threads with a ``COMPILE_STACK_BYTES`` stack, for what recurses in llguidance."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with _STACK_SIZE:  # a thread the pool starts for this task starts now, with the deep stack
            before = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                return self._pool.submit(fn, *args)
            finally:
                threading.stack_size(before)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a deep-stack thread, waiting for it."""
        return self.submit(fn, *args).result()


_COMPILING = _DeepStackPool(COMPILE_THREADS)


class Grammar:
    """One sequence's constraint: the matcher of its grammar, advanced token by token, and the mask of its
    first token when it was computed before the sequence was admitted (``GrammarCompiler.prepare``)."""

    def __init__(self, matcher: llguidance.LLMatcher, first_mask: np.ndarray | None = None) -> None:
        self.matcher = matcher
        self.first_mask = first_mask  # (V,) booleans, taken by the first ``GrammarCompiler.masks``

    def consume(self, token: int) -> bool:
        """Advance past ``token``, which the last mask allowed; False if the matcher refused it (it is then
        in an error state, and the sequence must end)."""
        return bool(self.matcher.consume_token(token))

    @property
    def failed(self) -> bool:
        """The matcher hit an error or one of llguidance's limits: no text it allows is whole any more."""
        return bool(self.matcher.is_error())

    @property
    def accepting(self) -> bool:
        """The text so far is whole: the grammar accepts it as it stands."""
        return not self.failed and bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        """What went wrong, content-free: llguidance's stop reason (its message may quote the grammar)."""
        return str(self.matcher.stop_reason())

    @property
    def finished(self) -> bool:
        """The grammar takes no further token (it is complete, or it failed): the sequence ends here."""
        return bool(self.matcher.is_stopped())


@dataclass(frozen=True)
class _Template:
    """A constraint compiled once: a fresh matcher and its first mask, copied for each sequence."""

    matcher: llguidance.LLMatcher
    first_mask: np.ndarray


class GrammarCompiler:
    """Constraints to grammars for one model's vocabulary, and the masks of a step's constrained rows.

    Everything that compiles runs on the deep-stack compile threads; a compiled constraint (its fresh
    matcher and first mask) is cached, so the door's check and the sequence's start compile it once."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_id: int, threads: int = 2) -> None:
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos_id)
        self.executor = llguidance.LLExecutor(num_threads=threads)
        # compiled constraints, and refused ones (a refusal can cost seconds: a{1000000}), by spec
        self._templates = lru_cache(maxsize=32)(self._template_or_refusal)

    def compile(self, structured: StructuredOutput) -> None:
        """Check ``structured`` against the bounds and this vocabulary, compile it and compute its first
        mask (cached by spec; blocks the caller meanwhile); raises GrammarError naming what it refused."""
        check_bounds(structured)
        _COMPILING.run(self._compiled, structured)

    def prepare(self, structured: StructuredOutput) -> Future[Grammar]:
        """A fresh matcher for one sequence, with its first mask, compiled on a compile thread: the
        engine admits the sequence once it is done (a GrammarError if the constraint does not compile)."""
        return _COMPILING.submit(self._start, structured)

    def start(self, structured: StructuredOutput) -> Grammar:
        """``prepare``, waiting for it."""
        return self.prepare(structured).result()

    def _start(self, structured: StructuredOutput) -> Grammar:
        check_bounds(structured)
        template = self._compiled(structured)
        return Grammar(template.matcher.deep_copy(), template.first_mask)

    def _compiled(self, structured: StructuredOutput) -> _Template:
        compiled = self._templates(structured)
        if isinstance(compiled, GrammarError):
            raise GrammarError(*compiled.args)
        return compiled

    def _template_or_refusal(self, structured: StructuredOutput) -> _Template | GrammarError:
        try:
            return self._template(structured)
        except GrammarError as exc:
            return exc

    def _template(self, structured: StructuredOutput) -> _Template:
        try:
            grammar = self._grammar(structured)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, self.tokenizer, limits=LIMITS
            )
        except GrammarError:
            raise
        except Exception as exc:  # whatever the client's constraint makes the grammar engine raise is its 400
            raise GrammarError(_terse(str(exc)) or type(exc).__name__) from None
        if is_error:
            raise GrammarError(_terse(messages[0]) if messages else "the grammar does not compile")
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=LIMITS)
        bitmask = np.frombuffer(matcher.compute_bitmask(), dtype=np.int32).reshape(1, -1)
        if matcher.is_error():  # no text it allows (a $ref cycle), or over a limit before the first token
            raise GrammarError(f"the grammar engine finds no text for it: {_terse(matcher.get_error())}")
        first = masks_to_allowed(bitmask, self.vocab_size)[0]
        self._follow_forced(matcher.deep_copy(), first)
        return _Template(matcher, first)

    def _follow_forced(self, probe: llguidance.LLMatcher, mask: np.ndarray) -> None:
        """Walk the tokens the grammar forces (one allowed, not the end), up to ``FORCED_PROBE`` of them:
        a constraint that fails on its only path (``a{1000000}``: llguidance's lexer limit after the first
        "a"; a schema that requires itself) is refused here, not ended mid-way."""
        for _ in range(FORCED_PROBE):
            (allowed,) = np.nonzero(mask)
            if len(allowed) != 1 or int(allowed[0]) == self.eos_id:
                return
            probe.consume_token(int(allowed[0]))
            if probe.is_stopped() and not probe.is_error():
                return
            bitmask = np.frombuffer(probe.compute_bitmask(), dtype=np.int32).reshape(1, -1)
            if probe.is_error():
                raise GrammarError(
                    f"no text satisfies it within the grammar engine's limits: {_terse(probe.get_error())}"
                )
            mask = masks_to_allowed(bitmask, self.vocab_size)[0]

    @staticmethod
    def _grammar(structured: StructuredOutput) -> str:
        kind, spec = structured.kind, structured.spec
        if kind == "json":
            schema = json.loads(spec)
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema is an object")
            return str(llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=JSON_OPTIONS))
        if kind == "json_object":
            return str(llguidance.LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS))
        if kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(spec))
        if kind == "choice":
            choices = json.loads(spec)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise ValueError("choices are one or more non-empty strings")
            return llguidance.grammar_from("choice", choices)  # type: ignore[arg-type]
        return str(llguidance.LLMatcher.grammar_from_lark(spec))

    def masks(self, grammars: Sequence[Grammar]) -> np.ndarray:
        """Each grammar's next-token mask, computed in parallel off the GIL: (n, vocab) booleans. A first
        mask computed before the sequence was admitted is used as it is."""
        allowed = np.zeros((len(grammars), self.vocab_size), dtype=bool)
        todo = []
        for i, g in enumerate(grammars):
            if g.first_mask is not None:
                allowed[i], g.first_mask = g.first_mask, None
            else:
                todo.append(i)
        if todo:
            bitmask = allocate_token_bitmask(len(todo), self.vocab_size)
            fill_next_token_bitmask_par(
                self.executor, [(grammars[i].matcher, k) for k, i in enumerate(todo)], bitmask
            )
            allowed[todo] = masks_to_allowed(bitmask, self.vocab_size)
        return allowed


def masks_to_allowed(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """llguidance's int32 bitmask (n, words), bit ``t % 32`` of word ``t // 32`` for token t, as (n, V) booleans."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)
