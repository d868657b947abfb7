"""The configurable request limits (MAX_TEXT_CHARS, MAX_ITEMS, ...), checked right after schema validation.

The schemas hold the fixed ranges of the API (beam_size 1..8, temperature
0..2, ...); these limits come from the settings, so they are checked here, with
the same 422 answer naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.errors import InvalidInputError
from service.settings import Settings


@dataclass(frozen=True)
class RequestLimits:
    max_text_chars: int
    max_context_chars: int
    max_items: int
    max_new_tokens: int
    max_total_new_tokens: int
    max_image_bytes: int
    max_image_pixels: int
    max_body_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(
            max_text_chars=settings.max_text_chars,
            max_context_chars=settings.max_context_chars,
            max_items=settings.max_items,
            max_new_tokens=settings.max_new_tokens,
            max_total_new_tokens=settings.max_total_new_tokens,
            max_image_bytes=settings.max_image_bytes,
            max_image_pixels=settings.max_image_pixels,
            max_body_bytes=settings.max_body_bytes,
        )

    def items(self, field: str, count: int) -> None:
        if count > self.max_items:
            raise InvalidInputError(
                f"{count} items; at most {self.max_items} per request (MAX_ITEMS)", field, "too_many_items"
            )

    def texts(self, fields_and_texts: Sequence[tuple[str, str]], limit: int | None = None) -> None:
        limit = self.max_text_chars if limit is None else limit
        for field, text in fields_and_texts:
            if len(text) > limit:
                raise InvalidInputError(f"{len(text)} characters; at most {limit}", field, "too_long")

    def contexts(self, fields_and_texts: Sequence[tuple[str, str]]) -> None:
        self.texts(fields_and_texts, self.max_context_chars)

    def new_tokens(self, field: str, value: int | None) -> None:
        if value is not None and value > self.max_new_tokens:
            raise InvalidInputError(
                f"{value} is over the limit of {self.max_new_tokens} (MAX_NEW_TOKENS)", field, "out_of_range"
            )

    def generation_budget(self, field: str, items: int, new_tokens: int | None, beams: int = 1) -> None:
        """A request's decoding work: items x new tokens (x beams) within MAX_TOTAL_NEW_TOKENS."""
        if new_tokens is None:
            return
        total = items * new_tokens * beams
        if total > self.max_total_new_tokens:
            shape = f"{items} items x {new_tokens} new tokens" + (f" x {beams} beams" if beams > 1 else "")
            raise InvalidInputError(
                f"{shape} = {total}; at most {self.max_total_new_tokens} per request (MAX_TOTAL_NEW_TOKENS)",
                field,
                "over_budget",
            )

    def image(self, field: str, data: bytes) -> None:
        if len(data) > self.max_image_bytes:
            raise InvalidInputError(
                f"image is {len(data)} bytes; at most {self.max_image_bytes} (MAX_IMAGE_BYTES)",
                field,
                "too_large",
            )
