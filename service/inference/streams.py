"""Streamed generation as the doors see it: one object for a request's streams, merged, that ends them.

A door iterates it and renders what comes (``TokenOut``: a choice's next token; ``ChoiceDone``: a
choice's ``Generation``, its finish reason among it), then reads ``usage()``. Its sequences are
cancelled in one place, by the response that owns the object (``api/http/streaming.py``): a door
renders and does nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from service.engine.generation_contract import TokenEvent
from service.pipelines.generate import OpenStream
from service.pipelines.results import Generation, Usage


@dataclass(frozen=True)
class TokenOut:
    """Choice ``choice``'s next token (choice ``k`` is prompt ``k // choices``, sample ``k % choices``)."""

    choice: int
    event: TokenEvent


@dataclass(frozen=True)
class ChoiceDone:
    """Choice ``choice`` ended: its whole ``Generation`` (text, finish reason, token counts)."""

    choice: int
    generation: Generation


@dataclass
class GenerationStreams:
    """One request's sequences, ``choices`` per prompt, prompt-major.

    Iterating it yields every choice's ``TokenOut`` as they come, each choice ending with its
    ``ChoiceDone``; an error of any choice ends the iteration. ``cancel()`` stops those still decoding.
    """

    model: str
    model_version: str
    streams: list[OpenStream]
    choices: int = 1
    on_end: Callable[[Usage], Awaitable[None]] | None = None  # the core's charge of the key's tokens
    _results: dict[int, Generation] = field(default_factory=dict, init=False, repr=False)
    _ended: bool = field(default=False, init=False, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.streams[:: self.choices])

    @property
    def count(self) -> int:
        """How many choices (prompts x choices per prompt)."""
        return len(self.streams)

    def usage(self) -> Usage:
        """The request's usage: each prompt's tokens once, and every token generated, however its choice
        ended: a choice that ended counts its ``Generation``; one cut short (the client left, an error)
        counts the tokens the engine had made for it. So a stream abandoned mid-way is charged in full."""
        outputs = sum(
            self._results[k].completion_tokens if k in self._results else stream.generated
            for k, stream in enumerate(self.streams)
        )
        return Usage(self.prompt_tokens, outputs)

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    async def close(self) -> None:
        """The response is over, however it ended: stop what still decodes, and account for the usage."""
        self.cancel()
        if self.on_end is not None and not self._ended:
            self._ended = True
            await self.on_end(self.usage())

    def __aiter__(self) -> AsyncIterator[TokenOut | ChoiceDone]:
        return self._one() if len(self.streams) == 1 else self._merged()

    async def _one(self) -> AsyncIterator[TokenOut | ChoiceDone]:
        (stream,) = self.streams
        async for event in stream:
            yield TokenOut(0, event)
        self._results[0] = await stream.result()
        yield ChoiceDone(0, self._results[0])

    async def _merged(self) -> AsyncIterator[TokenOut | ChoiceDone]:
        queue: asyncio.Queue[TokenOut | ChoiceDone | Exception] = asyncio.Queue()

        async def pump(choice: int, stream: OpenStream) -> None:
            try:
                async for event in stream:
                    queue.put_nowait(TokenOut(choice, event))
                queue.put_nowait(ChoiceDone(choice, await stream.result()))
            except Exception as exc:
                queue.put_nowait(exc)

        tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, ChoiceDone):
                    self._results[item.choice] = item.generation
                    remaining -= 1
                yield item
        finally:
            for task in tasks:
                task.cancel()
