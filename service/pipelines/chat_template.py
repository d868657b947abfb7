"""A chat template: a list of messages to one prompt, rendered with Jinja2 as ``transformers`` renders it.

``transformers``' ``apply_chat_template`` compiles the template in an ``ImmutableSandboxedEnvironment``
(``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension) with its own ``tojson`` filter and
the globals ``raise_exception`` and ``strftime_now``, and renders it with ``messages``,
``add_generation_prompt``, the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) and the
caller's keyword arguments. This does the same, without transformers: the sandbox keeps a template from
reaching Python's internals (attributes starting with ``_``, unsafe callables, mutation of its inputs).

What a client sends that the template cannot take is a ``ChatTemplateError`` naming the field: a
``raise_exception`` of the template (roles that do not alternate, say) or a failed render names
``messages``; a ``chat_template_kwargs`` key the template never reads names that key.

A template is untrusted (an imported checkpoint brings its own), so a render is bounded: it stops with a
``ChatTemplateError`` naming ``messages`` when it runs past ``timeout_s`` (checked at every line of the
template's code, through a per-thread trace, so a loop with an empty body stops too), when its output
passes ``max_chars``, when it recurses past Python's limit, or when it asks for a range over the
sandbox's 100,000 items, a string or list repeated past ``max_chars``, a power of over 100,000 bits, a
call or filter with an integer argument over ``max_chars``, or a format width over it. Nothing is
folded when the template compiles, so none of this runs at start-up. The pipeline renders off the
event loop (``asyncio``'s threads), so a slow one holds up no other request.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import FrameType
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.runtime import Context
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError"]

# What the template is always given; a client's chat_template_kwargs may not replace these.
RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "documents"})

TIMEOUT_S = 1.0  # a render's default time bound (CHAT_TEMPLATE_TIMEOUT_S)
MAX_CHARS = 4096  # a render's default output bound (MAX_TEXT_CHARS: the prompt could be no longer)
MAX_POWER_BITS = 100_000  # the largest integer ``**`` may make
_DIGITS = re.compile(r"\d{5,}")  # a run of digits that may say a width past any bound
TEMPLATE_FILE = "<template>"  # the file name of the code Jinja2 compiles a template string to


class ChatTemplateError(ValueError):
    """A request the template cannot render; ``field`` is the client's field at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class _TemplateRaised(Exception):
    """``raise_exception(message)`` inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: json.dumps without HTML escaping (Jinja2's own escapes <, >, & and ')."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _OverBound(BaseException):
    """A render ran past a bound: a BaseException, so no ``except Exception`` on its way out (a filter's,
    Jinja2's own) takes it for the template's error and renders on."""


class _FilterOverBound(ValueError):
    """A filter's argument or a ``format`` string past a bound: an Exception, so that Jinja2's constant
    folding, which tries them on constants as the template compiles, gives up and leaves them to the
    render."""


class _Bounded(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*``, ``**``, ``%``, ``format`` and the integer arguments of calls and filters
    bounded by ``max_chars``; no constant folding, so nothing of the template runs when it compiles."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, max_chars: int, **options: Any) -> None:
        super().__init__(optimized=False, **options)
        self.max_chars = max_chars
        self.filters = {name: self._bounded(f) for name, f in self.filters.items()}

    def _bounded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)  # keeps Jinja2's pass_context / pass_environment marks
        def bounded(*args: Any, **kwargs: Any) -> Any:
            try:
                self._check_args(fn, args, kwargs)
            except _OverBound as exc:  # an Exception here: when it compiles, Jinja2 leaves it to the render
                raise _FilterOverBound(str(exc)) from None
            return fn(*args, **kwargs)

        return bounded

    def _check_args(self, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and abs(value) > max(self.max_chars, MAX_RANGE):
                raise _OverBound(f"calls {getattr(fn, '__name__', 'a function')} with {value}")

    def _check_format(self, spec: str) -> None:
        """A format string's widths and precisions (its runs of digits) within ``max_chars``."""
        for digits in _DIGITS.findall(spec):
            if int(digits) > self.max_chars:
                raise _OverBound(f"formats with a width of {int(digits)}")

    def call_binop(self, context: Context, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "%":
            if isinstance(left, str):
                self._check_format(left)
        elif operator_ == "*":
            for seq, count in ((left, right), (right, left)):
                repeated = isinstance(seq, (str, list, tuple)) and isinstance(count, int)
                if repeated and len(seq) * count > self.max_chars:
                    raise _OverBound(f"repeats a {len(seq)}-item value {count} times")
        elif isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = max(abs(left).bit_length() - 1, 1) * right
            if bits > MAX_POWER_BITS:
                raise _OverBound(f"raises {left} to the power {right}")
        return super().call_binop(context, operator_, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self._check_args(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """A string's ``format`` / ``format_map``, as the sandbox wraps it, once its widths are checked."""
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            try:
                self._check_format(value.__self__)
            except _OverBound as exc:  # an Exception here: when it compiles, Jinja2 leaves it to the render
                raise _FilterOverBound(str(exc)) from None
        return wrapped


def _deadline_tracer(deadline: float, timeout_s: float) -> Callable[[FrameType, str, Any], Any]:
    """A ``sys.settrace`` function that stops the template's code at ``deadline``: it looks at every line
    the template's compiled code runs (and every call), and nothing else runs traced."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _OverBound(f"took longer than {timeout_s:g} s")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _OverBound(f"took longer than {timeout_s:g} s")
        return local if frame.f_code.co_filename == TEMPLATE_FILE else None

    return calls


class ChatTemplate:
    """One compiled template and the special tokens it is rendered with; ``render`` is thread-safe."""

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str],
        timeout_s: float = TIMEOUT_S,
        max_chars: int = MAX_CHARS,
    ) -> None:
        """Raises jinja2.TemplateSyntaxError for a template that does not compile (a configuration error).
        A render stops past ``timeout_s`` or ``max_chars`` characters of output (the module docstring)."""
        env = _Bounded(max_chars, trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.template = env.from_string(source)
        self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))
        self.special_tokens = dict(special_tokens)
        self.timeout_s = timeout_s
        self.max_chars = max_chars

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt for ``messages`` (each ``{"role", "content", ...}``), ending with the assistant's turn
        when ``add_generation_prompt``; ``kwargs`` are the client's extra template variables."""
        extra = dict(kwargs or {})
        for name in extra:
            if name in RESERVED or name not in self.variables:
                known = ", ".join(sorted(self.variables - RESERVED)) or "none"
                raise ChatTemplateError(
                    f"the chat template has no variable {name!r} a request may set (it reads: {known})",
                    f"chat_template_kwargs.{name}",
                )
        context = {
            **self.special_tokens,
            **extra,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "tools": None,
            "documents": None,
        }
        try:
            return self._bounded(context)
        except (_OverBound, _FilterOverBound) as exc:
            raise ChatTemplateError(f"the chat template stopped: it {exc}", "messages") from None
        except RecursionError:
            raise ChatTemplateError("the chat template recursed too deeply", "messages") from None
        except OverflowError as exc:  # the sandbox's range over MAX_RANGE items, a float too large
            raise ChatTemplateError(f"the chat template asked too much: {exc}", "messages") from None
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"the chat template refused the messages: {exc}", "messages") from None
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"the chat template did something unsafe: {exc}", "messages") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(
                f"the chat template could not render the messages: {exc}", "messages"
            ) from None

    def _bounded(self, context: Mapping[str, Any]) -> str:
        """The render, piece by piece, within ``max_chars`` and, traced, within ``timeout_s`` (the tracer
        is this thread's only while it renders; the one before, a debugger's, is put back)."""
        pieces: list[str] = []
        size = 0
        before = sys.gettrace()
        sys.settrace(_deadline_tracer(time.monotonic() + self.timeout_s, self.timeout_s))
        try:
            for piece in self.template.generate(**context):
                size += len(piece)
                if size > self.max_chars:
                    raise _OverBound(f"wrote over {self.max_chars} characters (MAX_TEXT_CHARS)")
                pieces.append(piece)
        finally:
            sys.settrace(before)
        return "".join(pieces)
