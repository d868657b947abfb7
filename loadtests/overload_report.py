"""The overload run's report: per-phase summaries, the printed table, and the contract's check.

:func:`check` lists the breaches of the overload contract (``overload.py``'s docstring states it)
from a :class:`Report` and the overload phases' records.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from overload_driver import Limits, MiB, Record

from harness.stats import percentile


@dataclass
class PhaseSummary:
    name: str
    kind: str  # an endpoint kind, or "all"
    seconds: float  # until the last answer came
    target_rate: float | None  # requests/s asked of the open loop (None: closed loop)
    offered_rate: float  # requests/s actually sent, over the time they were offered
    accepted_rate: float  # 200s per second, until the last answer
    statuses: dict[str, int]  # "200", "429", "503", ..., "client error"
    p50_s: float  # admitted latency (NaN: none admitted)
    p95_s: float
    p99_s: float
    max_s: float
    refused_p50_s: float = math.nan  # 429/503: how fast a refusal comes back
    refused_p99_s: float = math.nan
    peak_rss_mib: float | None = None
    skipped: int = 0  # arrivals the client could not send (too many open requests)
    peak_open: int | None = None  # most requests open at once (open loop)


def summarize(
    name: str,
    kind: str,
    records: Sequence[Record],
    offered_s: float,
    seconds: float,
    target_rate: float | None = None,
    peak_rss: int | None = None,
    skipped: int = 0,
    peak_open: int | None = None,
) -> PhaseSummary:
    """``offered_s``: how long requests were being sent; ``seconds``: until the last answer."""
    statuses = Counter(str(r.status) if r.status else "no answer" for r in records)
    admitted = [r.latency_s for r in records if r.status == 200]
    refused = [r.latency_s for r in records if r.status in (429, 503)]
    return PhaseSummary(
        name=name,
        kind=kind,
        seconds=seconds,
        target_rate=target_rate,
        offered_rate=len(records) / max(offered_s, 1e-9),
        accepted_rate=len(admitted) / max(seconds, 1e-9),
        statuses=dict(sorted(statuses.items())),
        p50_s=percentile(admitted, 50),
        p95_s=percentile(admitted, 95),
        p99_s=percentile(admitted, 99),
        max_s=max(admitted, default=math.nan),
        refused_p50_s=percentile(refused, 50),
        refused_p99_s=percentile(refused, 99),
        peak_rss_mib=None if peak_rss is None else peak_rss / MiB,
        skipped=skipped,
        peak_open=peak_open,
    )


@dataclass
class Report:
    limits: Limits
    factor: float
    capacity: dict[str, float]  # admitted requests/s per kind, closed loop
    items: int = 1  # inputs per request
    phases: list[PhaseSummary] = field(default_factory=list)
    baseline_rss_mib: float | None = None  # after warm-up (the capacity phase), before overload
    overload_peaks_mib: list[float | None] = field(default_factory=list)
    max_queue_depth: dict[str, float] = field(default_factory=dict)
    rejected_queue_full: float | None = None  # tserve_requests_rejected_total{reason="queue_full"}, summed
    ready_after: int | None = None  # /health/ready status afterwards
    alive_after: bool | None = None
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        def ms(v: float) -> str:
            return "-" if math.isnan(v) else f"{v * 1000:.0f}"

        head = (
            f"{'phase':<12} {'kind':<10} {'target/s':>8} {'offered/s':>9} {'accepted/s':>10} "
            f"{'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'refused p50/p99 ms':>18} "
            f"{'peak RSS MiB':>12}  statuses"
        )
        lines = [head, "-" * len(head)]
        for p in self.phases:
            target = "-" if p.target_rate is None else f"{p.target_rate:.1f}"
            rss = "-" if p.peak_rss_mib is None else f"{p.peak_rss_mib:.1f}"
            statuses = " ".join(f"{k}:{v}" for k, v in p.statuses.items())
            if p.skipped:
                statuses += f" unsent:{p.skipped}"
            if p.peak_open is not None:
                statuses += f" (open at most {p.peak_open})"
            refused = f"{ms(p.refused_p50_s)}/{ms(p.refused_p99_s)}"
            lines.append(
                f"{p.name:<12} {p.kind:<10} {target:>8} {p.offered_rate:>9.1f} {p.accepted_rate:>10.1f} "
                f"{ms(p.p50_s):>7} {ms(p.p95_s):>7} {ms(p.p99_s):>7} {ms(p.max_s):>7} {refused:>18} "
                f"{rss:>12}  {statuses}"
            )
        capacity = ", ".join(f"{k} {v:.1f}/s" for k, v in self.capacity.items())
        baseline = "-" if self.baseline_rss_mib is None else f"{self.baseline_rss_mib:.1f} MiB"
        lines += [
            "",
            f"capacity (closed loop, {self.items} input(s) per request): {capacity}; "
            f"overload factor {self.factor:g}",
            f"limits: MAX_QUEUE_SIZE {self.limits.max_queue_size}, QUEUE_TIMEOUT_S "
            f"{self.limits.queue_timeout_s:g}, admitted bound {self.limits.admitted_bound_s:g} s",
            f"RSS after warm-up {baseline}; overload peaks "
            + ", ".join("-" if v is None else f"{v:.1f}" for v in self.overload_peaks_mib)
            + " MiB",
            f"deepest queue seen: {self.max_queue_depth or '-'}; rejected queue_full: "
            f"{self.rejected_queue_full}; ready afterwards: {self.ready_after}; alive: {self.alive_after}",
        ]
        return "\n".join(lines)


def check(report: Report, records: Sequence[Record]) -> list[str]:
    """The contract's breaches, one line each (empty: it held). ``records``: every overload request."""
    limits = report.limits
    broken: list[str] = []
    if not records:
        return ["no overload request was sent"]

    def examples(bad: list[Record]) -> str:
        return "; ".join(
            f"{r.kind} {r.status or r.error} after {r.latency_s:.2f}s (type {r.error_type})" for r in bad[:3]
        )

    unanswered = [r for r in records if r.status == 0]
    if unanswered:
        broken.append(f"{len(unanswered)} requests got no HTTP answer: {examples(unanswered)}")
    server_errors = [r for r in records if r.status >= 500 and r.status != 503]
    if server_errors:
        broken.append(f"{len(server_errors)} answers were 5xx other than 503: {examples(server_errors)}")
    other = [r for r in records if r.status not in (0, 200, 429, 503) and r.status < 500]
    if other:
        broken.append(f"{len(other)} answers were neither 200, 429 nor 503: {examples(other)}")

    def retry_after_ok(r: Record) -> bool:
        return r.retry_after is not None and r.retry_after.isdigit() and int(r.retry_after) >= 1

    no_retry = [r for r in records if r.status in (429, 503) and not retry_after_ok(r)]
    if no_retry:
        broken.append(
            f"{len(no_retry)} refusals lack a Retry-After >= 1 (e.g. {no_retry[0].retry_after!r}): "
            + examples(no_retry)
        )
    if not any(r.status in (429, 503) for r in records):
        broken.append("nothing was refused: the offered load did not fill the queues, or they are unbounded")
    late = [r for r in records if r.status == 200 and r.latency_s > limits.admitted_bound_s]
    if late:
        broken.append(
            f"{len(late)} admitted requests took longer than QUEUE_TIMEOUT_S + compute bound "
            f"({limits.admitted_bound_s:g} s): {examples(late)}"
        )
    if not any(r.status == 200 for r in records):
        broken.append("no request was admitted during overload")
    unsent = sum(p.skipped for p in report.phases)
    if unsent:
        broken.append(
            f"{unsent} arrivals were not sent: the server held the client's cap of open requests, "
            "so requests queue without bound somewhere before the model queues"
        )
    deep = {m: d for m, d in report.max_queue_depth.items() if d > limits.max_queue_size}
    if deep:
        broken.append(f"queue depth exceeded MAX_QUEUE_SIZE {limits.max_queue_size}: {deep}")

    peaks = [p for p in report.overload_peaks_mib if p is not None]
    if report.baseline_rss_mib is not None and len(peaks) == len(report.overload_peaks_mib) >= 2:
        top = max(peaks)
        if top - report.baseline_rss_mib > limits.rss_growth_mib:
            broken.append(
                f"peak RSS {top:.1f} MiB is {top - report.baseline_rss_mib:.1f} MiB over the "
                f"{report.baseline_rss_mib:.1f} MiB after warm-up (bound {limits.rss_growth_mib:g} MiB)"
            )
        # Not climbing: the later half of the phases peaks no higher than the earlier half (plus slack).
        # Halves rather than phase 1 alone, so that allocator and arena growth finishing in phase 2
        # of a long soak is not taken for a leak, while a steady leak still shows.
        half = len(peaks) // 2
        earlier, later = max(peaks[:half]), max(peaks[half:])
        if later > earlier + limits.rss_phase_slack_mib:
            broken.append(
                f"RSS climbs across phases: phases {half + 1}-{len(peaks)} peaked at {later:.1f} MiB, "
                f"phases 1-{half} at {earlier:.1f} MiB (slack {limits.rss_phase_slack_mib:g} MiB)"
            )
    if report.alive_after is False:
        broken.append("the service process died")
    if report.ready_after != 200:
        broken.append(f"/health/ready answered {report.ready_after} after the overload, not 200")
    if not report.rejected_queue_full:
        broken.append(
            f'/metrics counts {report.rejected_queue_full} tserve_requests_rejected_total{{reason="queue_full"}}'
        )
    return broken
