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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par
from tokenizers import Tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = ["Grammar", "GrammarCompiler", "GrammarError", "StructuredOutput", "masks_to_allowed"]

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


class Grammar:
    """One sequence's constraint: the matcher of its grammar, advanced token by token."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def consume(self, token: int) -> bool:
        """Advance past ``token``, which the last mask allowed; False if the matcher refused it (it is then
        in an error state, and the sequence must end)."""
        return bool(self.matcher.consume_token(token))

    @property
    def error(self) -> str:
        return str(self.matcher.get_error())

    @property
    def finished(self) -> bool:
        """The grammar takes no further token (it is complete): the sequence ends here."""
        return bool(self.matcher.is_stopped())


class GrammarCompiler:
    """Constraints to grammars for one model's vocabulary, and the masks of a step's constrained rows."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_id: int, threads: int = 2) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos_id)
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self._compiled = lru_cache(maxsize=256)(self._compile)

    def compile(self, structured: StructuredOutput) -> str:
        """The llguidance grammar of ``structured``, checked against this vocabulary (cached by spec);
        raises GrammarError naming what it refused."""
        return self._compiled(structured)

    def _compile(self, structured: StructuredOutput) -> str:
        try:
            grammar = self._grammar(structured)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        except Exception as exc:  # whatever the client's constraint makes the grammar engine raise is its 400
            raise GrammarError(str(exc) or type(exc).__name__) from None
        if is_error:
            raise GrammarError(messages[0] if messages else "the grammar does not compile")
        return grammar

    @staticmethod
    def _grammar(structured: StructuredOutput) -> str:
        kind, spec = structured.kind, structured.spec
        if kind == "json":
            schema = json.loads(spec)
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema is an object")
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
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

    def start(self, structured: StructuredOutput) -> Grammar:
        """A fresh matcher for one sequence."""
        matcher = llguidance.LLMatcher(self.tokenizer, self.compile(structured))
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return Grammar(matcher)

    def masks(self, grammars: Sequence[Grammar]) -> np.ndarray:
        """Each grammar's next-token mask, computed in parallel off the GIL: (n, vocab) booleans."""
        bitmask = allocate_token_bitmask(len(grammars), self.vocab_size)
        fill_next_token_bitmask_par(self.executor, [(g.matcher, i) for i, g in enumerate(grammars)], bitmask)
        return masks_to_allowed(bitmask, self.vocab_size)


def masks_to_allowed(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """llguidance's int32 bitmask (n, words), bit ``t % 32`` of word ``t // 32`` for token t, as (n, V) booleans."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)
