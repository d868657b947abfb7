"""Prometheus metrics: defined once here, recorded where each decision is made.

The engine knows nothing of Prometheus: its batchers and decoding loops call
observer hooks (``BatcherObserver``, ``GenerationObserver``), and the
observers below turn those calls into metrics. HTTP metrics come from the
request middleware (``service.api.http.observe``), cache hits and misses from the
response cache, cache errors from the Redis backend.

Names follow the Prometheus conventions: a ``tserve_`` namespace, base units
(``_seconds``), ``_total`` for counters. Histogram buckets come from the
settings (METRICS_*_BUCKETS).

Several workers: with WORKERS > 1, ``python -m service`` points
PROMETHEUS_MULTIPROC_DIR at a fresh directory before any worker starts;
every worker then writes its samples there and ``/metrics`` (served by any
worker) aggregates all of them (prometheus_client's multiprocess mode;
gauges sum over live workers). In containers, one worker per container is
the recommended layout: Prometheus scrapes each replica.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.exposition import choose_encoder

from service.engine import scheduling
from service.settings import Settings

if TYPE_CHECKING:
    from service.engine.variants import ServedVariant

__all__ = ["Metrics", "multiprocess_enabled"]

NAMESPACE = "tserve"


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class Metrics:
    """Every metric of one app, registered in its own registry (so tests can run several apps)."""

    def __init__(
        self,
        latency_buckets: Sequence[float],
        batch_size_buckets: Sequence[float],
        batch_tokens_buckets: Sequence[float],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, namespace=NAMESPACE, registry=self.registry)

        def gauge(
            name: str, doc: str, labels: list[str], mode: Literal["livesum", "max"] = "livesum"
        ) -> Gauge:
            return Gauge(
                name, doc, labels, namespace=NAMESPACE, registry=self.registry, multiprocess_mode=mode
            )

        def histogram(name: str, doc: str, labels: list[str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, namespace=NAMESPACE, buckets=buckets, registry=self.registry)

        by_request = ["route", "method", "model", "status"]
        model = ["model"]

        # --- HTTP ---------------------------------------------------------------------------
        self.http_requests = counter("http_requests", "HTTP requests answered", by_request)
        self.http_latency = histogram(
            "http_request_duration_seconds",
            "Time from request start to the end of the response body (streams included)",
            by_request,
            latency_buckets,
        )
        self.http_in_flight = gauge("http_requests_in_flight", "HTTP requests being answered", ["route"])

        self.event_loop_lag = histogram(
            "event_loop_lag_seconds",
            "How late the event loop ran a timer due every 10 ms: time every request waits for its turn",
            [],
            latency_buckets,
        )
        self.shed = counter(
            "requests_shed",
            "HTTP requests refused at the edge, low priority while the event loop lagged over SHED_LAG_MS",
            [],
        )
        self.spans_dropped = counter(
            "trace_spans_dropped",
            "Finished spans that never reached the collector: the exporter's queue was full (queue_full), "
            "the export failed (export_failed), or the exporter had shut down (already_shutdown)",
            ["reason"],
        )

        # --- gRPC (GRPC_PORT) -----------------------------------------------------------------
        by_call = ["method", "model", "code"]
        self.grpc_requests = counter("grpc_requests", "gRPC calls answered (Open Inference v2)", by_call)
        self.grpc_latency = histogram(
            "grpc_request_duration_seconds",
            "Time from a gRPC call's start to its answer",
            by_call,
            latency_buckets,
        )
        self.grpc_in_flight = gauge("grpc_requests_in_flight", "gRPC calls being answered", ["method"])

        # --- queues and batches ---------------------------------------------------------------
        self.queue_seconds = histogram(
            "queue_duration_seconds",
            "Time an item waited in a model's queue before its batch ran",
            model,
            latency_buckets,
        )
        self.compute_seconds = histogram(
            "compute_duration_seconds",
            "Time per batch (generation: per prefill or decoding step) from handing it to the model's "
            "compute thread until the event loop resumes with its results: the model call, plus any wait "
            "for a busy event loop",
            model,
            latency_buckets,
        )
        self.batch_size = histogram(
            "batch_size", "Items per model call (generation: sequences per step)", model, batch_size_buckets
        )
        self.batch_tokens = histogram(
            "batch_tokens", "Padded tokens per model call (longest x count)", model, batch_tokens_buckets
        )
        self.queue_depth = gauge(
            "queue_depth", "Items (generation: requests) waiting in a model's queue", model
        )
        self.model_in_flight = gauge(
            "model_in_flight", "Items in the batch being computed (generation: sequences running)", model
        )
        self.rejected = counter(
            "requests_rejected",
            "Requests or items refused before reaching the model (queue_full, timeout, closed)",
            ["model", "reason"],
        )
        by_class = ["model", "priority"]
        self.class_depth = gauge(
            "priority_queue_depth", "Items waiting in a model's queue, by priority class", by_class
        )
        self.class_wait = histogram(
            "priority_wait_seconds",
            "Time an item waited before its model took it, by priority class",
            by_class,
            latency_buckets,
        )
        self.class_expired = counter(
            "priority_expired",
            "Items removed unanswered at their deadline (the client's, or QUEUE_TIMEOUT_S), by class",
            by_class,
        )
        self.class_displaced = counter(
            "priority_displaced",
            "Items refused from a full queue to make room for a more urgent one, by class",
            by_class,
        )
        self.dropped = counter(
            "requests_dropped",
            "Items or sequences dropped because their client went away (client_disconnected)",
            ["model", "reason"],
        )

        # --- generation ----------------------------------------------------------------------
        self.generated_tokens = counter("generated_tokens", "Tokens generated", model)
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Time from admission to a sequence's first token",
            model,
            latency_buckets,
        )
        self.time_per_output_token = histogram(
            "time_per_output_token_seconds",
            "Time between consecutive tokens of a sequence (inter-token latency)",
            model,
            latency_buckets,
        )
        self.generations = counter(
            "generations",
            "Finished sequences by finish reason (length, stop, eos)",
            ["model", "finish_reason"],
        )
        self.prefix_cache_queries = counter(
            "prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache", model
        )
        self.prefix_cache_hits = counter(
            "prefix_cache_hit_tokens", "Prompt tokens whose keys/values the prefix cache held", model
        )
        self.spec_proposed = counter(
            "speculative_proposed_tokens", "Tokens proposed by n-gram speculation (prompt lookup)", model
        )
        self.spec_accepted = counter(
            "speculative_accepted_tokens",
            "Proposed tokens that decoding accepted (acceptance rate: over proposed)",
            model,
        )
        self.prefix_cache_blocks = gauge(
            "prefix_cache_blocks", "KV blocks resident in the prefix cache", model
        )
        self.prefix_cache_bytes = gauge("prefix_cache_bytes", "Bytes of KV blocks in the prefix cache", model)

        # --- response cache ------------------------------------------------------------------
        self.cache_hits = counter("cache_hits", "Responses answered from the cache", model)
        self.cache_misses = counter("cache_misses", "Cache look-ups that found nothing", model)
        self.cache_errors = counter(
            "cache_errors",
            "Cache calls that failed, or were skipped while the backend is down (served uncached)",
            ["backend", "operation"],
        )

        # --- what is served ------------------------------------------------------------------
        self.model_info = gauge(
            "model_info",
            "A loaded model (always 1): its version, the execution provider its session got, and the "
            "variant of its graphs it serves (reference, fused, int8, fp16) with that variant's precision",
            ["model", "version", "task", "execution_provider", "variant", "precision"],
            mode="max",
        )
        self.quota_refusals = counter(
            "quota_refusals",
            "Requests refused by their API key's quota, by key id and limit",
            ["key", "limit"],
        )
        self.quota_tokens = counter(
            "quota_tokens",
            "Tokens read and generated, charged to API keys (API_KEYS_FILE), by key id",
            ["key"],
        )
        self.quota_refunds = counter(
            "quota_refunds",
            "Requests counted against their API key's requests per minute and then given back: the service "
            "refused them without doing their work (shed, overloaded, a full queue, a deadline passed)",
            ["key"],
        )
        self.quota_errors = counter(
            "quota_errors", "Quota checks whose store (Redis) failed (QUOTA_FAIL_OPEN decides)", []
        )
        self.model_state = gauge(
            "model_state",
            "Each loaded version: 1 while it serves, 0 once it is retired (replaced or unloaded; its "
            "sessions freed when its last request ended)",
            ["model", "version"],
            mode="max",
        )
        self.model_load_seconds = histogram(
            "model_load_seconds",
            "Time to load a model while serving: its folder checked, sessions opened and warmed up",
            [],
            (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.model_loads = counter(
            "model_loads", "Loads and reloads while serving, by result (loaded, failed)", ["result"]
        )
        self.model_resident_bytes = gauge(
            "model_resident_bytes",
            "What each loaded version holds resident: the process's growth while it loaded and warmed up "
            "(measured with MODEL_MEMORY_BUDGET, one load at a time)",
            ["model", "version"],
            mode="max",
        )
        self.model_evictions = counter(
            "model_evictions", "Idle models unloaded to make room within MODEL_MEMORY_BUDGET", []
        )
        # (model, version) -> its model_info labels, and how many pipelines serve it (a reload of the same
        # files serves the same version twice, until the first copy retires)
        self._served_labels: dict[tuple[str, str], tuple[str, ...]] = {}
        self._serving: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    def from_settings(cls, settings: Settings) -> Metrics:
        return cls(
            settings.metrics_latency_buckets,
            settings.metrics_batch_size_buckets,
            settings.metrics_batch_tokens_buckets,
        )

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) in the format the scraper accepts (OpenMetrics or the text format), from
        this process's registry, or from every worker's samples in multiprocess mode."""
        encode, content_type = choose_encoder(accept or "")
        if multiprocess_enabled():
            registry = CollectorRegistry()
            prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return encode(registry), content_type
        return encode(self.registry), content_type

    # --- observers handed to the engine and the cache ----------------------------------------

    def batcher_observer(self, model: str) -> BatcherMetrics:
        return BatcherMetrics(self, model)

    def generation_observer(self, model: str) -> GenerationMetrics:
        return GenerationMetrics(self, model)

    def on_cache_hit(self, model: str) -> None:
        self.cache_hits.labels(model).inc()

    def on_cache_miss(self, model: str) -> None:
        self.cache_misses.labels(model).inc()

    def on_cache_error(self, backend: str, operation: str) -> None:
        self.cache_errors.labels(backend, operation).inc()

    def served(self, model: str, version: str, task: str, provider: str, variant: ServedVariant) -> None:
        labels = (model, version, task, provider, variant.name, variant.precision)
        self._served_labels[(model, version)] = labels
        self._serving[(model, version)] += 1
        self.model_info.labels(*labels).set(1)
        self.model_state.labels(model, version).set(1)
        # Zero-valued series exist from the start, so rate() and alerts see them before the first event.
        self.queue_depth.labels(model).set(0)
        self.model_in_flight.labels(model).set(0)
        self.cache_hits.labels(model)
        self.cache_misses.labels(model)

    def retired(self, model: str, version: str) -> None:
        """A version replaced or unloaded, its sessions freed: it leaves model_info, its state turns 0."""
        key = (model, version)
        self._serving[key] -= 1
        if self._serving[key] > 0:  # the same files serve on, reloaded
            return
        del self._serving[key]
        labels = self._served_labels.pop(key, None)
        if labels is not None:
            self.model_info.remove(*labels)
        self.model_state.labels(model, version).set(0)

    def quota_refused(self, key_id: str, limit: str) -> None:
        self.quota_refusals.labels(key_id, limit).inc()

    def tokens_charged(self, key_id: str, tokens: int) -> None:
        self.quota_tokens.labels(key_id).inc(tokens)

    def quota_refunded(self, key_id: str) -> None:
        self.quota_refunds.labels(key_id).inc()

    def quota_error(self) -> None:
        self.quota_errors.inc()

    def resident(self, model: str, version: str, size: int | None) -> None:
        if size is None:
            with contextlib.suppress(KeyError):
                self.model_resident_bytes.remove(model, version)
        else:
            self.model_resident_bytes.labels(model, version).set(size)

    def evicted(self, model: str) -> None:
        self.model_evictions.inc()

    def loaded(self, model: str, result: str, seconds: float) -> None:
        self.model_loads.labels(result).inc()
        if result == "loaded":
            self.model_load_seconds.observe(seconds)


# Engine reject reasons -> (metric, reason label). "cancelled" means the client went away.
_REJECT = {
    "queue_full": ("rejected", "queue_full"),
    "timeout": ("rejected", "timeout"),
    "deadline": ("rejected", "deadline"),
    "closed": ("rejected", "closed"),
    "cancelled": ("dropped", "client_disconnected"),
}


class _ModelObserver:
    """What both engine observers share: the model's label, its compute, batch, queue and in-flight
    series, and refusals sorted into rejected / dropped."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._m = metrics
        self._model = model
        self._compute_seconds = metrics.compute_seconds.labels(model)
        self._batch_size = metrics.batch_size.labels(model)
        self._depth = metrics.queue_depth.labels(model)
        self._in_flight = metrics.model_in_flight.labels(model)
        classes = scheduling.NAMES.items()
        self._class_depth = {n: metrics.class_depth.labels(model, name) for n, name in classes}
        self._class_wait = {n: metrics.class_wait.labels(model, name) for n, name in classes}
        self._class_expired = {n: metrics.class_expired.labels(model, name) for n, name in classes}
        self._class_displaced = {n: metrics.class_displaced.labels(model, name) for n, name in classes}

    def on_reject(self, reason: str) -> None:
        kind, label = _REJECT.get(reason, ("rejected", reason))
        getattr(self._m, kind).labels(self._model, label).inc()

    def on_class_depth(self, depths: dict[int, int]) -> None:
        for number, gauge in self._class_depth.items():
            gauge.set(depths.get(number, 0))

    def on_class_wait(self, priority: int, seconds: float) -> None:
        self._class_wait[priority].observe(seconds)

    def on_class_expired(self, priority: int) -> None:
        self._class_expired[priority].inc()

    def on_class_displaced(self, priority: int) -> None:
        self._class_displaced[priority].inc()


class BatcherMetrics(_ModelObserver):
    """A DynamicBatcher's observer (service.engine.batcher.BatcherObserver)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        super().__init__(metrics, model)
        self._queue_seconds = metrics.queue_seconds.labels(model)
        self._batch_tokens = metrics.batch_tokens.labels(model)

    def on_enqueue(self, depth: int) -> None:
        self._depth.set(depth)

    def on_dequeue(self, depth: int) -> None:
        self._depth.set(depth)

    def on_batch(
        self, size: int, padded_tokens: int, queue_seconds: list[float], compute_seconds: float
    ) -> None:
        for waited in queue_seconds:
            self._queue_seconds.observe(waited)
        self._compute_seconds.observe(compute_seconds)
        self._batch_size.observe(size)
        self._batch_tokens.observe(padded_tokens)

    def on_in_flight(self, items: int) -> None:
        self._in_flight.set(items)


class GenerationMetrics(_ModelObserver):
    """A GenerationEngine's observer (service.engine.generation_contract.GenerationObserver)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        super().__init__(metrics, model)
        self._tokens = metrics.generated_tokens.labels(model)
        self._ttft = metrics.time_to_first_token.labels(model)
        self._tpot = metrics.time_per_output_token.labels(model)

    def on_first_token(self, seconds: float) -> None:
        self._tokens.inc()
        self._ttft.observe(seconds)

    def on_token(self, inter_token_seconds: float) -> None:
        self._tokens.inc()
        self._tpot.observe(inter_token_seconds)

    def on_step(self, batch_size: int, seconds: float) -> None:
        self._batch_size.observe(batch_size)
        self._compute_seconds.observe(seconds)

    def on_finish(self, reason: str, completion_tokens: int) -> None:
        self._m.generations.labels(self._model, reason).inc()

    def on_cancel(self) -> None:
        self.on_reject("cancelled")

    def on_depth(self, waiting: int, running: int) -> None:
        self._depth.set(waiting)
        self._in_flight.set(running)

    def on_speculation(self, proposed_tokens: int, accepted_tokens: int) -> None:
        self._m.spec_proposed.labels(self._model).inc(proposed_tokens)
        self._m.spec_accepted.labels(self._model).inc(accepted_tokens)

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int, blocks: int, bytes: int) -> None:
        self._m.prefix_cache_queries.labels(self._model).inc(queried_tokens)
        self._m.prefix_cache_hits.labels(self._model).inc(hit_tokens)
        self._m.prefix_cache_blocks.labels(self._model).set(blocks)
        self._m.prefix_cache_bytes.labels(self._model).set(bytes)
