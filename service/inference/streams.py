"""Streamed generation as the doors see it: the live streams of one request, and how they end."""

from __future__ import annotations

from dataclasses import dataclass

from service.pipelines.generate import OpenStream
from service.pipelines.results import Generation, Usage


@dataclass(frozen=True)
class GenerationStreams:
    """One request's sequences, ``choices`` per prompt, prompt-major: iterate each for its ``TokenEvent``s,
    then ``await result()`` for its ``Generation``; ``cancel()`` stops those still decoding."""

    model: str
    model_version: str
    streams: list[OpenStream]
    choices: int = 1

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.streams[:: self.choices])

    def usage(self, results: list[Generation]) -> Usage:
        """The request's usage, once its streams have ended with ``results`` (in stream order)."""
        return Usage.of_generations(results, self.choices)

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()
