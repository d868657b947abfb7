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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError"]

# What the template is always given; a client's chat_template_kwargs may not replace these.
RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


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


class ChatTemplate:
    """One compiled template and the special tokens it is rendered with; ``render`` is thread-safe."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        """Raises jinja2.TemplateSyntaxError for a template that does not compile (a configuration error)."""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.template = env.from_string(source)
        self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))
        self.special_tokens = dict(special_tokens)

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
            return self.template.render(**context)
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"the chat template refused the messages: {exc}", "messages") from None
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"the chat template did something unsafe: {exc}", "messages") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(
                f"the chat template could not render the messages: {exc}", "messages"
            ) from None
