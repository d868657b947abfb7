"""The configurable request limits (MAX_TEXT_CHARS, MAX_ITEMS, ...): applied once, by the inference core.

The doors' schemas hold the fixed ranges of their protocol (beam_size 1..8,
temperature 0..2, ...); these limits come from the settings, and every door's
request meets them here, in ``InferenceService``. Errors name the core's
parameter (``INPUTS``, ``CONTEXTS``, ``MAX_NEW_TOKENS``) and the item's index;
each door renames them to its own fields.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, fields

from service.errors import InvalidInputError
from service.settings import Settings

INPUTS = "inputs"  # a request's items: texts, prompts, images, or QA questions
CONTEXTS = "contexts"  # QA contexts, beside their questions
MAX_NEW_TOKENS = "max_new_tokens"
QUERIES = "queries"  # rerank and score: each pair's query
DOCUMENTS = "documents"  # rerank and score: each pair's document


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
    max_request_pixels: int  # applied by the image pipeline, from the headers, before decoding
    max_context_tokens: int  # applied by the QA pipeline, once its windows are cut
    attention_max_tokens: int = 128
    max_queue_size: int = 256  # a generation's sequences must fit one model's queue

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        """Each limit from the setting of the same name (MAX_ITEMS -> ``max_items``)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def items(self, count: int) -> None:
        if count > self.max_items:
            raise InvalidInputError(
                f"{count} items; at most {self.max_items} per request (MAX_ITEMS)", INPUTS, "too_many_items"
            )

    def documents(self, count: int) -> None:
        """A rerank or score request's pairs (one query with N documents is N pairs): at most MAX_ITEMS."""
        if count > self.max_items:
            raise InvalidInputError(
                f"{count} documents; at most {self.max_items} per request (MAX_ITEMS)",
                DOCUMENTS,
                "too_many_documents",
            )

    def sentences(self, count: int) -> None:
        """A translation's sentences, every document's together: each is an item (MAX_ITEMS)."""
        if count > self.max_items:
            raise InvalidInputError(
                f"{count} sentences in all; each sentence is an item, at most {self.max_items} per request "
                "(MAX_ITEMS)",
                INPUTS,
                "too_many_items",
            )

    def texts(self, texts: Sequence[str], param: str = INPUTS) -> None:
        """Each text not blank, and within MAX_TEXT_CHARS (contexts: MAX_CONTEXT_CHARS)."""
        limit = self.max_context_chars if param == CONTEXTS else self.max_text_chars
        for index, text in enumerate(texts):
            if not text.strip():
                raise InvalidInputError("must not be empty or whitespace only", param, "blank_text", index)
            if len(text) > limit:
                raise InvalidInputError(f"{len(text)} characters; at most {limit}", param, "too_long", index)

    def new_tokens(self, value: int | None) -> None:
        if value is not None and value > self.max_new_tokens:
            raise InvalidInputError(
                f"{value} is over the limit of {self.max_new_tokens} (MAX_NEW_TOKENS)",
                MAX_NEW_TOKENS,
                "out_of_range",
            )

    def generation_budget(self, items: int, new_tokens: int | None, beams: int = 1) -> None:
        """A request's decoding work: items x new tokens (x beams) within MAX_TOTAL_NEW_TOKENS."""
        if new_tokens is None:
            return
        total = items * new_tokens * beams
        if total > self.max_total_new_tokens:
            shape = f"{items} items x {new_tokens} new tokens" + (f" x {beams} beams" if beams > 1 else "")
            raise InvalidInputError(
                f"{shape} = {total}; at most {self.max_total_new_tokens} per request (MAX_TOTAL_NEW_TOKENS)",
                MAX_NEW_TOKENS,
                "over_budget",
            )

    def sequences(self, prompts: int, choices: int, field: str) -> None:
        """A generation's sequences (prompts x choices) within one model's queue, MAX_QUEUE_SIZE: a
        request that could never be queued whole is the client's error (naming ``field``, the choices'
        parameter), not a full queue's 429 to retry."""
        if prompts * choices > self.max_queue_size:
            raise InvalidInputError(
                f"{prompts} prompts x {choices} sequences each = {prompts * choices} sequences; a model "
                f"queues at most {self.max_queue_size} (MAX_QUEUE_SIZE), so this request can never fit",
                field if choices > 1 else INPUTS,
                "too_many_sequences",
            )

    def images(self, images: Sequence[bytes]) -> None:
        for index, data in enumerate(images):
            if len(data) > self.max_image_bytes:
                raise InvalidInputError(
                    f"image is {len(data)} bytes; at most {self.max_image_bytes} (MAX_IMAGE_BYTES)",
                    INPUTS,
                    "too_large",
                    index,
                )


def image_bytes(field: str, value: str | bytes, max_bytes: int) -> bytes:
    """An image as a client sent it, as bytes: base64 text (the standard alphabet, line breaks allowed, an
    optional ``data:image/...;base64,`` prefix), or, as bytes, the image itself unless it is ASCII (then
    base64: JSON carries bytes as strings). Text that could only decode to over ``max_bytes`` is refused
    before it is decoded (MAX_IMAGE_BYTES; the decoded size is checked with the other limits)."""
    as_bytes = isinstance(value, bytes)
    if isinstance(value, bytes):
        if not value.isascii():
            return value
        value = value.decode("ascii")
    if value.startswith("data:"):
        header, _, value = value.partition(",")
        if not header.endswith(";base64"):
            raise InvalidInputError("a data: URL must be base64-encoded", field, "undecodable_image")
    value = "".join(value.split())
    if len(value) > 4 * (max_bytes // 3 + 1):
        raise InvalidInputError(f"image is over {max_bytes} bytes (MAX_IMAGE_BYTES)", field, "too_large")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        what = "neither PNG/JPEG bytes nor base64" if as_bytes else "not valid base64"
        raise InvalidInputError(f"image is {what}: {exc}", field, "undecodable_image") from exc
