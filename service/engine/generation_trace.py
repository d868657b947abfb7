"""One generated sequence in its request's trace, recorded when its stream ends (finished, failed or cancelled).

The sequence's span follows the GenAI semantic conventions (``text_completion {model}``, with the model,
the request's sampling settings, input and output tokens and the finish reason). Its children: the
``queue`` wait for a place in the running batch, the ``prefill`` (linked to the prefill's ``batch`` span,
the model run shared with the sequences that joined with it) and the ``decode`` phase as one span with
the token count and the first token as an event (``gen_ai.server.time_to_first_token``), not a span per
token. A stream that ends early (its client went away) ends its spans then, with what it had.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.trace import Link

from service.observe import spans

from .generation_contract import GenerationRequest


@dataclass
class SequenceTrace:
    """What a traced sequence's spans are recorded from: its request's context and the times of its phases
    (``time.monotonic()`` readings; 0 for a phase it never reached)."""

    context: Context
    request: GenerationRequest
    submitted_at: float
    admitted_at: float = 0.0
    prefill_started: float = 0.0
    prefill_ended: float = 0.0
    prefill_batch: list[Link] = field(default_factory=list)

    def record(
        self,
        model: Mapping[str, str],
        *,
        output_tokens: int,
        finish_reason: str,
        first_token_at: float = 0.0,
        error: BaseException | None = None,
    ) -> None:
        """The sequence's spans, ending now; ``first_token_at`` 0: it had none."""
        now = time.monotonic()
        name = model.get("inference.model.name", "")
        sampling = self.request.sampling
        attributes: dict[str, str | int | float | list[str]] = {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.model": name,
            "gen_ai.response.model": name,
            "gen_ai.usage.input_tokens": len(self.request.prompt_ids),
            "gen_ai.usage.output_tokens": output_tokens,
            "gen_ai.response.finish_reasons": [finish_reason],
            "gen_ai.request.temperature": 0.0 if sampling.greedy else sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.top_k": sampling.top_k,
            **model,
        }
        if sampling.max_new_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = sampling.max_new_tokens
        if sampling.seed is not None:
            attributes["gen_ai.request.seed"] = sampling.seed
        if self.request.request_id:
            attributes["gen_ai.response.id"] = self.request.request_id
        sequence = spans.start(f"text_completion {name}", self.context, self.submitted_at, attributes)
        if sequence is None:
            return
        spans.record("queue", sequence, self.submitted_at, self.admitted_at or now)
        if self.prefill_started:
            spans.record(
                "prefill",
                sequence,
                self.prefill_started,
                self.prefill_ended or now,
                {"gen_ai.usage.input_tokens": len(self.request.prompt_ids)},
                self.prefill_batch,
            )
        if self.prefill_ended:
            events = []
            if first_token_at:
                ttft = first_token_at - self.submitted_at
                events.append(("first_token", first_token_at, {"gen_ai.server.time_to_first_token": ttft}))
            spans.record(
                "decode",
                sequence,
                self.prefill_ended,
                now,
                {
                    "gen_ai.usage.output_tokens": output_tokens,
                    "gen_ai.response.finish_reasons": [finish_reason],
                },
                events=events,
            )
        spans.end(sequence, now, error=error)
