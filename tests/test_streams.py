"""The one stream object every streaming door renders: choices merged, each ending with its generation.

``GenerationStreams`` (``service/inference/streams.py``) is what the core hands ``/v1/generate``,
``/v1/completions`` and ``/v2/.../generate_stream``. Here on fake sequences, no model or server: the
events of several choices interleave as they come, each choice ends with its ``ChoiceDone``, usage
counts each prompt once, an error of one choice ends the iteration, and ``cancel`` reaches every
sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.inference import ChoiceDone, Generation, GenerationStreams, TokenEvent, TokenOut


class FakeStream:
    """An ``OpenStream``: its tokens (one per ``delay``), then its generation or an error."""

    def __init__(self, texts: list[str], delay: float, prompt_tokens: int = 3, fail: bool = False) -> None:
        self.texts, self.delay, self.prompt_tokens, self.fail = texts, delay, prompt_tokens, fail
        self.cancelled = False

    async def _events(self) -> AsyncIterator[TokenEvent]:
        for i, text in enumerate(self.texts):
            await asyncio.sleep(self.delay)
            yield TokenEvent(index=i, token_id=100 + i, text=text)
        if self.fail:
            raise RuntimeError("decoding failed")

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def result(self) -> Generation:
        return Generation("".join(self.texts), "length", self.prompt_tokens, len(self.texts))

    def cancel(self) -> None:
        self.cancelled = True


def _collect(streams: GenerationStreams) -> list[TokenOut | ChoiceDone]:
    async def run() -> list[TokenOut | ChoiceDone]:
        return [item async for item in streams]

    return asyncio.run(run())


def test_one_choice_streams_its_tokens_then_its_generation() -> None:
    streams = GenerationStreams("gpt", "v1", [FakeStream(["a", "b"], 0)])  # type: ignore[list-item]
    items = _collect(streams)
    assert [i.event.text for i in items if isinstance(i, TokenOut)] == ["a", "b"]
    assert isinstance(items[-1], ChoiceDone) and items[-1].generation.text == "ab"
    assert (streams.usage().input_tokens, streams.usage().output_tokens) == (3, 2)


def test_choices_interleave_as_they_come_and_usage_counts_each_prompt_once() -> None:
    # two prompts, two samples each (prompt-major): the fast choices finish first
    fake: list[Any] = [
        FakeStream(["x"] * 3, 0.03, prompt_tokens=5),
        FakeStream(["y"] * 3, 0.001, prompt_tokens=5),
        FakeStream(["z"] * 2, 0.02, prompt_tokens=7),
        FakeStream(["w"] * 1, 0.001, prompt_tokens=7),
    ]
    streams = GenerationStreams("gpt", "v1", fake, choices=2)
    items = _collect(streams)
    done = [i.choice for i in items if isinstance(i, ChoiceDone)]
    assert sorted(done) == [0, 1, 2, 3] and done[0] in (1, 3)  # by arrival, not by index
    for k, stream in enumerate(fake):  # each choice's tokens in order, ending with its generation
        mine = [i for i in items if i.choice == k]
        assert [i.event.text for i in mine if isinstance(i, TokenOut)] == stream.texts
        assert isinstance(mine[-1], ChoiceDone) and mine[-1].generation.completion_tokens == len(stream.texts)
    usage = streams.usage()
    assert (usage.input_tokens, usage.output_tokens) == (5 + 7, 3 + 3 + 2 + 1)


def test_an_error_of_one_choice_ends_the_iteration_and_cancel_reaches_every_sequence() -> None:
    fake: list[Any] = [FakeStream(["a"] * 50, 0.01), FakeStream(["b"], 0.001, fail=True)]
    streams = GenerationStreams("gpt", "v1", fake)
    with pytest.raises(RuntimeError, match="decoding failed"):
        _collect(streams)
    streams.cancel()  # the one cancel site: the response that owns the streams
    assert all(s.cancelled for s in fake)
