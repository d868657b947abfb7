"""The in-process transport of the pipelines' one way to compute (``base.Workers``): the model runs here.

Every pipeline reaches its model through the ``Workers`` it is built with: ``batcher`` (a model's dynamic
batcher), ``generation_engine`` (a generation model's continuous batching) and ``compute`` (a named
model-side method on the model's compute thread). ``LocalWorkers`` answers them in this process, with the
engine's own ``DynamicBatcher`` and ``GenerationEngine``; a front end of the split service is given
``ipc/remote_host.RemoteHost`` instead, whose answers come from the engine process, which itself builds
its pipelines over ``LocalWorkers``. So a pipeline has one path, whichever process it is in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service.engine.batcher import BatcherObserver, BatchPolicy, DynamicBatcher
from service.engine.continuous_batching import GenerationEngine
from service.engine.repository import LoadedModel
from service.engine.speculation import Speculation
from service.observe.metrics import Metrics
from service.settings import Settings

# The model-side methods ``compute`` may run, by the name a pipeline gives (what a front end may name to the
# engine process: ``engine_host/server.py``), as the blocking function of the pipeline it runs.
COMPUTE: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "attention_weights": lambda pipeline: pipeline.attention_maps.weights,
}


class LocalWorkers:
    def batcher(
        self,
        model: LoadedModel,
        run_batch: Callable[[list[Any]], Sequence[Any]],
        policy: BatchPolicy,
        observer: BatcherObserver | None,
    ) -> DynamicBatcher[Any, Any]:
        return DynamicBatcher(
            model.name, policy, run_batch, observer, model.span_attributes, instances=model.instances
        )

    def generation_engine(
        self, model: LoadedModel, settings: Settings, metrics: Metrics | None
    ) -> GenerationEngine:
        s = settings
        return GenerationEngine(
            model,
            max_running=s.max_running_sequences,
            max_queue_size=s.max_queue_size,
            queue_timeout_s=s.queue_timeout_s,
            observer=metrics.generation_observer(model.name) if metrics is not None else None,
            prefix_cache_bytes=int(s.prefix_cache_mib * 2**20),
            prefix_block_tokens=s.prefix_cache_block_tokens,
            speculation=Speculation(
                s.speculative_ngram_tokens,
                s.speculative_ngram_max,
                min(s.speculative_ngram_min, s.speculative_ngram_max),
                s.speculative_ngram_max_rows,
            )
            if s.speculative_ngram_tokens
            else None,
        )

    async def compute(self, pipeline: Any, method: str, *args: Any) -> Any:
        """``method``'s model-side function (``COMPUTE``) on the pipeline's model compute thread."""
        run = COMPUTE.get(method)
        if run is None:
            raise ValueError(f"{method!r} is not a model-side method")
        return await pipeline.in_compute_thread(run(pipeline), *args)


LOCAL = LocalWorkers()
