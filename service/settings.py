"""Service configuration: every knob is an environment variable (no prefix), read by pydantic-settings.

Field names are the lower-case variable names; matching is case-insensitive, so
``MAX_BATCH_SIZE=8`` in the environment and ``Settings(MAX_BATCH_SIZE=8)`` in code
both set ``settings.max_batch_size``. The defaults below are the documented
defaults (README, "Configuration").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1024 * 1024


def _env_list(value: Any) -> Any:
    """A list from the environment: JSON (``[0.1, 1]``) or plain comma-separated values (``0.1,1``)."""
    if isinstance(value, str):
        text = value.strip()
        return json.loads(text) if text.startswith("[") else [v.strip() for v in text.split(",") if v.strip()]
    return value


Buckets = Annotated[list[float], NoDecode, BeforeValidator(_env_list)]
# API keys and CORS origins from the environment: a JSON list or plain comma-separated values.
Words = Annotated[list[str], NoDecode, BeforeValidator(_env_list)]


# Set by ``python -m service`` in its own environment (and so its workers'): create_app then makes all
# ONNX Runtime sessions of the process share one thread pool (ORT_THREAD_POOL=shared).
SHARED_POOL_FLAG = "TSERVE_SHARED_THREAD_POOL"
# Set by ``python -m service`` (and so its workers): the process is the service's alone, so create_app may
# tune process-wide state such as the garbage collector (``gc_tuning.py``), which an app embedded in
# another process (tests, a host application) must leave alone.
OWN_PROCESS_FLAG = "TSERVE_OWN_PROCESS"


class Settings(BaseSettings):
    """All service settings; an unknown keyword in code is an error, unrelated environment variables are not."""

    model_config = SettingsConfigDict(
        case_sensitive=False, extra="forbid", protected_namespaces=(), env_ignore_empty=True
    )

    # --- where and how to serve ---------------------------------------------------------
    model_repository: Path = Field(
        default=Path("models"), description="Model repository: one folder per model"
    )
    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 in containers)")
    port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Open Inference Protocol v2 over gRPC (KServe's GRPCInferenceService) on this port, on "
        "HOST, in the same process as HTTP; unset: off",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="TLS on both doors (HTTPS, and gRPC over TLS): the server's certificate chain (PEM), "
        "with TLS_KEY_FILE; unset: plain HTTP and gRPC, TLS left to the ingress",
    )
    tls_key_file: Path | None = Field(default=None, description="The private key (PEM) of TLS_CERT_FILE")
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="Mutual TLS: every client (probes included) must present a certificate signed by one "
        "of these CAs (PEM), on both doors; needs TLS_CERT_FILE",
    )
    tls_handshake_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="With TLS: a connection's handshake must finish within this, else it is dropped (a client "
        "that opens connections and never completes them holds none); HEADER_READ_TIMEOUT_S starts after it",
    )
    workers: int = Field(default=1, ge=1, description="uvicorn worker processes; each loads its own models")
    frontends: int = Field(
        default=0,
        ge=0,
        le=64,
        description="0: one process does everything (HTTP, gRPC, the models). N: the split service, N "
        "front-end processes sharing the HTTP and gRPC ports (the doors, keys, the cache, tokenizing) and "
        "one engine process (batching, continuous batching, the models), over ZeroMQ",
    )
    engine_start_timeout_s: float = Field(
        default=600.0, gt=0, description="FRONTENDS >= 1: how long a front end waits for the engine to serve"
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: one line per record; json: one JSON object per line, with the request id, the "
        "model, and the trace_id and span_id of the request's trace (with traces on)",
    )
    served_models: Words = Field(
        default=[],
        description="Model names (folders) to load, comma-separated; empty: every folder. One model per "
        "process, pod or KServe InferenceService; a name with no folder is refused like a broken one",
    )
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        default="none",
        description="none: the models of start-up serve until the process ends; explicit: the Open Inference "
        "Protocol's repository extension loads, reloads and unloads them (ADMIN_API_KEYS); poll: the "
        "repository is scanned every MODEL_REPOSITORY_POLL_S and a new, changed or removed folder is "
        "loaded, reloaded or unloaded. A reload never stops serving: the new version warms up beside the "
        "old, which finishes its requests",
    )
    model_version_policy: dict[str, dict[str, Any]] = Field(
        default={},
        description="Version policies by model name, over each model's config.json: JSON such as "
        '{"gpt": {"latest": {"num_versions": 2}}}, {"specific": {"versions": [1, 3]}} or {"all": {}}; '
        "a model without one serves its newest version folder",
    )
    model_memory_budget: int = Field(
        default=0,
        ge=0,
        description="Bytes of resident memory the models may hold (each model's is measured as it loads); "
        "0: no budget. Past it, a model loads on its first request, and the least recently used idle "
        "model is unloaded to make room (a model with work in flight never is)",
    )
    model_min_residency_s: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="With MODEL_MEMORY_BUDGET: a model loaded on demand is not unloaded to make room for "
        "another before it has been resident this long; a request whose model needs that room waits for it "
        "(within QUEUE_TIMEOUT_S). Bounds the loads that clients alternating between models can cause",
    )
    model_repository_poll_s: float = Field(
        default=5.0, gt=0, description="MODEL_CONTROL_MODE=poll: seconds between two scans of the repository"
    )

    # --- ONNX Runtime --------------------------------------------------------------------
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="auto: CUDA when the session really gets it, else CPU; cuda: fail without it",
    )
    intra_op_threads: int = Field(default=0, ge=0, description="0 lets ONNX Runtime choose")
    model_variant: Literal["auto", "reference", "fused", "int8", "fp16"] = Field(
        default="auto",
        description="Which copy of each model's graphs: auto serves, per device, the fastest variant that "
        "passed the export's rule (batch-invariant, accurate enough; int8 also 1.1x faster than fused where "
        "it was built) (CPU: int8, then fused; CUDA: fp16, then fused), else the fp32 "
        "reference; a name serves that variant where the model has it",
    )
    kv_cache: Literal["inplace", "concat"] = Field(
        default="inplace",
        description="How a decoder's KV cache grows: inplace writes each step's keys/values into a buffer "
        "preallocated per running batch (where the served variant has that step graph: on CUDA the fp16 "
        "one, its buffers kept on the device), concat copies the past into a new tensor every step (the "
        "exported graphs' own way)",
    )
    cuda_graphs: bool = Field(
        default=False,
        description="On CUDA, capture the runs whose shapes repeat as CUDA graphs and replay them (ONNX "
        "Runtime's enable_cuda_graph): the decoder's in-place steps with the running batch padded to a "
        "bucket, and the encoders' batches padded to batch and length buckets. Off until measured "
        "(docs/PERFORMANCE.md, 'On a GPU')",
    )
    tensorrt: bool = Field(
        default=False,
        description="On CUDA, run the encoders (BERT heads, ViT) on ONNX Runtime's TensorRT provider first, "
        "fp16, its engines cached in TENSORRT_CACHE_DIR; CUDA where TensorRT's libraries are missing",
    )
    tensorrt_cache_dir: str = Field(
        default="",
        description="TENSORRT=true: where TensorRT's engines and timing cache are kept across restarts "
        "(default: a folder under the system's temporary directory)",
    )
    inter_op_threads: int = Field(default=1, ge=0)
    model_instances: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Instances of each batched model (every task but text-generation): N sessions of each "
        "graph, INTRA_OP_THREADS split between them (0: the cores), and N batches computed at once, as "
        "Triton's instance_group; each holds its own copy of the weights. Above 1, every session of the "
        "process has its own thread pool (ORT_THREAD_POOL=shared is off)",
    )
    ort_thread_pool: Literal["shared", "per-session"] = Field(
        default="shared",
        description="python -m service: every ONNX Runtime session of the process shares one intra-op "
        "thread pool of INTRA_OP_THREADS (shared), or each session has its own (per-session, ONNX "
        "Runtime's default; also what INTRA_OP_SPINNING=false and an app embedded in another process get)",
    )
    intra_op_spinning: bool = Field(
        default=True,
        description="Let ONNX Runtime's idle intra-op threads spin before sleeping (its default); off, they "
        "leave the cores to the event loop between model calls",
    )

    # --- dynamic batching (encoder models, translator) ---------------------------------
    max_batch_size: int = Field(default=32, ge=1)
    max_batch_tokens: int = Field(
        default=8192, ge=1, description="Padded-token budget per batch (longest x count)"
    )
    max_queue_delay_ms: float = Field(
        default=0.0,
        ge=0,
        description="Longest wait for a batch to fill while the model is idle (batches form anyway while "
        "it computes; on CPU waiting only adds latency)",
    )
    batch_split_ratio: float = Field(
        default=1.25,
        ge=0,
        description="Length-sorted sub-batches: a new one starts past ratio x the shortest (<= 1: off)",
    )
    batch_split_min_tokens: int = Field(
        default=4, ge=1, description="Items up to ratio x this many tokens always share a sub-batch"
    )
    max_queue_size: int = Field(default=256, ge=1, description="Waiting items per model; beyond it: 429")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait in a queue; beyond it: 503")
    max_in_flight_requests: int = Field(
        default=1024,
        ge=1,
        description="HTTP requests answered at once per worker, counted once their body has arrived; beyond "
        "it: 503",
    )
    shed_lag_ms: float = Field(
        default=5.0,
        ge=0,
        description="While the event loop runs this many ms late (LoopLag), an HTTP request whose header or "
        "key makes it low priority is refused at the edge (429 `shed`) before any parsing; 0: never",
    )
    shed_queue_depth: int = Field(
        default=64,
        ge=0,
        description="FRONTENDS >= 1: a front end also sheds low-priority requests at the edge while the engine "
        "has this many high- and normal-priority items waiting (its published queue depths); 0: never",
    )
    header_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="From a connection's opening (or its previous response) to the end of the next request's "
        "headers at most this; beyond it: 408 and the connection closed (slow clients hold no connection)",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="From the end of a request's headers to the end of its body at most this; beyond it: 408 "
        "and the connection closed. A request is not counted in flight while its body arrives",
    )

    # --- generation (continuous batching) ------------------------------------------------
    max_running_sequences: int = Field(default=16, ge=1, description="Sequences decoded together per step")
    prefix_cache_mib: float = Field(
        default=64.0,
        ge=0,
        description="Automatic prefix caching: MiB of prompt-prefix KV blocks kept per generation model and "
        "shared across requests (least recently used evicted first); 0: off",
    )
    prefix_cache_block_tokens: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="Tokens per prefix-cache block (a prefix is reused in whole blocks)",
    )
    prefix_cache_shared_across_keys: bool = Field(
        default=False,
        description="With API keys: false gives each key its own prefix-cache blocks (a salt of the key in "
        "the first block's hash: no key reuses, or can time, another's cached prompt); true shares them",
    )
    speculative_ngram_tokens: int = Field(
        default=0,
        ge=0,
        le=16,
        description="N-gram speculative decoding (prompt lookup): tokens proposed per step from the text's own "
        "earlier n-grams and checked in one model call; 0: off",
    )
    speculative_ngram_max: int = Field(default=3, ge=1, le=16, description="Longest n-gram matched")
    speculative_ngram_min: int = Field(default=2, ge=1, le=16, description="Shortest n-gram matched")
    speculative_ngram_max_rows: int = Field(
        default=4,
        ge=1,
        description="Speculate only while the running batch holds at most this many sequences (a larger batch "
        "already keeps the cores busy; its wider checks cost more than the proposals save)",
    )
    chat_template: Path | None = Field(
        default=None,
        description="A Jinja2 chat template file for POST /v1/chat/completions, used by every text-generation "
        "model in place of its manifest's chat_template (as vLLM's --chat-template); unset: the manifest's, "
        "and a model without one answers chat with 400",
    )
    chat_template_timeout_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Longest render of a chat template (its output is at most MAX_TEXT_CHARS); past it: 400",
    )

    # --- request limits ------------------------------------------------------------------
    max_text_chars: int = Field(default=4096, ge=1, description="Characters per text, prompt or question")
    max_context_chars: int = Field(
        default=3000, ge=1, description="Characters per QA context (SQuAD's longest here: 2,166)"
    )
    max_items: int = Field(
        default=32,
        ge=1,
        description="Inputs per request (texts, images, prompts, QA pairs, rerank documents)",
    )
    max_new_tokens: int = Field(default=256, ge=1, description="Upper bound of max_new_tokens")
    max_total_new_tokens: int = Field(
        default=8192,
        ge=1,
        description="Per request: items x max_new_tokens (x beam_size when translating) at most this",
    )
    max_body_bytes: int = Field(default=4 * MiB, ge=1024, description="Request body limit (413 beyond)")
    attention_max_tokens: int = Field(
        default=128,
        ge=2,
        description="return_attention: the most tokens (or patches + [CLS]) an input may have, and the most "
        "target tokens a translation's map may have (max_new_tokens at most this - 1)",
    )
    max_image_bytes: int = Field(default=2 * MiB, ge=1, description="Encoded bytes per image")
    max_image_pixels: int = Field(
        default=2**23, ge=1, description="Width x height per image, read from the header"
    )
    max_request_pixels: int = Field(
        default=2**23,
        ge=1,
        description="Width x height summed over one request's images, read from their headers before any is "
        "decoded: what bounds a request's decoding time (docs/CONFIGURATION.md, 'Cost per request')",
    )
    max_context_tokens: int = Field(
        default=1536,
        ge=1,
        description="QA: tokens in one request's windows, summed over its pairs (what usage.input_tokens "
        "counts): what bounds a request's compute (docs/CONFIGURATION.md, 'Cost per request')",
    )

    gc_threshold: int = Field(
        default=10000,
        ge=0,
        description="Allocations between two collections of Python's youngest generation once the service "
        "is ready (0: Python's 700); what start-up built is frozen out of the collector then (service/gc_tuning.py)",
    )
    malloc_trim_mib: int = Field(
        default=32,
        ge=0,
        description="Once resident memory has grown this many MiB past where the last trim left it (checked "
        "every second), return freed heap memory to the OS (glibc's malloc_trim); 0: never",
    )

    # --- start-up and shutdown -----------------------------------------------------------
    warmup: bool = Field(default=True, description="Run one real inference per model before reporting ready")
    shutdown_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM: readiness turns 503 and in-flight requests (streams too) get this long to finish",
    )

    # --- response cache ------------------------------------------------------------------
    cache_enabled: bool = Field(default=True, description="Cache deterministic responses")
    redis_url: str | None = Field(
        default=None, repr=False, description="Redis response cache; unset: in-process LRU"
    )
    cache_ttl_s: float = Field(default=3600.0, gt=0, description="Lifetime of a cached response")
    cache_max_entries: int = Field(default=10000, ge=1, description="Entries in the in-process LRU at most")
    cache_max_bytes: int = Field(
        default=256 * MiB, ge=1, description="Bytes of cached responses in the in-process LRU at most"
    )
    cache_scope: Literal["key", "shared"] = Field(
        default="key",
        description="With API keys: key gives each key its own cache entries (a hit never tells one key what "
        "another sent); shared lets every key answer every other's repeats. Without keys: one space",
    )
    cache_key_prefix: str = Field(default="tserve", min_length=1, description="Namespace of the Redis keys")
    redis_timeout_s: float = Field(
        default=0.25, gt=0, description="Socket connect/read timeout per Redis call: a slow Redis is down"
    )
    redis_max_connections: int = Field(default=64, ge=1, description="Redis connection pool size")
    cache_retry_interval_s: float = Field(
        default=2.0, ge=0, description="After a Redis failure, serve uncached this long before trying again"
    )
    cache_error_log_interval_s: float = Field(
        default=30.0, ge=0, description="At most one log line per interval about Redis failures"
    )

    # --- security ------------------------------------------------------------------------
    api_keys: Words = Field(
        default=[],
        repr=False,
        description="Accepted API keys (Authorization: Bearer KEY, or X-API-Key: KEY); empty: no auth",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="TOML or YAML file of API keys with limits (service/access/quotas.py): per key an id, the "
        "key's sha256, requests and tokens per minute, a default priority, the models it may use; shared "
        "by every replica through REDIS_URL. Its keys are accepted beside API_KEYS",
    )
    quota_fail_open: bool = Field(
        default=True,
        description="When the quota store (Redis) fails: let requests through (true) or refuse them with 503",
    )
    admin_api_keys: Words = Field(
        default=[],
        repr=False,
        description="Keys that may load and unload models (MODEL_CONTROL_MODE=explicit), presented like API "
        "keys; empty: only a service listening on loopback (HOST 127.0.0.1, ::1 or localhost) takes control "
        "calls, from anyone who can reach it",
    )
    auth_health: bool = Field(default=False, description="With API keys: /health/* needs a key too")
    auth_metrics: bool = Field(default=False, description="With API keys: /metrics needs a key too")
    cors_allow_origins: Words = Field(
        default=[],
        description="Origins allowed by CORS (e.g. https://app.example.com, or *); empty: CORS off",
    )
    access_log: bool = Field(
        default=True,
        description="One INFO line per request: id, route, status, model, bytes in/out, seconds (never text)",
    )

    # --- metrics -------------------------------------------------------------------------
    metrics_latency_buckets: Buckets = Field(
        default=[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        min_length=1,
        description="Histogram buckets (seconds) for request, queue, compute and token latencies",
    )
    metrics_batch_size_buckets: Buckets = Field(
        default=[1, 2, 4, 8, 16, 32, 64, 128], min_length=1, description="Buckets for items per batch"
    )
    metrics_batch_tokens_buckets: Buckets = Field(
        default=[16, 64, 256, 1024, 4096, 16384, 65536],
        min_length=1,
        description="Buckets for padded tokens per batch",
    )

    @model_validator(mode="after")
    def _buckets_ascend(self) -> Settings:
        for name in ("metrics_latency_buckets", "metrics_batch_size_buckets", "metrics_batch_tokens_buckets"):
            buckets = getattr(self, name)
            if any(b <= 0 for b in buckets) or sorted(set(buckets)) != buckets:
                raise ValueError(f"{name.upper()} must be positive and strictly ascending, got {buckets}")
        return self

    @model_validator(mode="after")
    def _one_process_model(self) -> Settings:
        if self.frontends and self.workers > 1:
            raise ValueError(
                "FRONTENDS (the split service's front ends) and WORKERS > 1 (whole copies) exclude "
                "each other: set one"
            )
        return self

    @model_validator(mode="after")
    def _tls_is_whole(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS_CERT_FILE and TLS_KEY_FILE go together: set both, or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("TLS_CLIENT_CA_FILE (mutual TLS) needs TLS_CERT_FILE and TLS_KEY_FILE")
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name.upper()} {path} is not a readable file")
        return self

    @model_validator(mode="after")
    def _items_fit_the_queue(self) -> Settings:
        # One request's items enter a model queue together; more than the queue holds could never be admitted.
        if self.max_items > self.max_queue_size:
            raise ValueError(
                f"MAX_ITEMS ({self.max_items}) must not exceed MAX_QUEUE_SIZE ({self.max_queue_size})"
            )
        return self
