"""ONNX Runtime sessions: provider choice, thread counts, and the device the session really got.

`get_available_providers()` lists CUDA whenever onnxruntime-gpu is installed,
even on a machine with no GPU or no CUDA 13 libraries; the session then falls
back to CPU. So the provider is read from `session.get_providers()` after
creation, and that is what the service reports and uses (IO binding only on
CUDA).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import instances
from .errors import SessionFreedError
from .variants import ServingDevice, VariantChoice

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
import onnxruntime as ort

log = logging.getLogger(__name__)

Device = Literal["auto", "cuda", "cpu"]
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class RuntimeOptions:
    device: Device = "auto"
    intra_op_threads: int = 0  # 0 lets ONNX Runtime choose (one per physical core)
    inter_op_threads: int = 1
    cuda_device_id: int = 0
    graph_optimization: str = "all"
    variant: VariantChoice = "auto"  # which copy of the graphs (service.engine.variants)
    spinning: bool = True  # ONNX Runtime's default: idle intra-op threads spin before they sleep
    kv_cache: Literal["inplace", "concat"] = "inplace"  # decoders on CPU (service.engine.kv_cache)
    # sessions per graph, the intra-op threads split between them (service.engine.instances)
    instances: int = 1
    # CUDA graphs (service.engine.cuda_graphs) for the graphs whose shapes can be made to repeat: the loader
    # turns it off for every other graph. Off by default until measured (docs/PERFORMANCE.md, "On a GPU").
    cuda_graphs: bool = False
    # TensorRT before CUDA for the encoders (BERT heads, ViT), fp16, engines cached on disk; the loader turns
    # it off for the decoders. Falls back to CUDA where TensorRT's libraries are missing.
    tensorrt: bool = False
    tensorrt_cache_dir: str = ""  # "" -> tensorrt_cache_dir(): a folder under the system's temporary one
    max_batch_size: int = 32  # the encoders' largest batch: TensorRT's shape profile, CUDA graphs' buckets
    max_length: int = (
        0  # the model's token window (its manifest's; set by the loader): the same two's lengths
    )


_shared_pool = False  # set once per process by use_shared_thread_pool


def use_shared_thread_pool(intra_op_threads: int, inter_op_threads: int) -> bool:
    """Make every ONNX Runtime session of this process share one intra-op thread pool; call it first.

    With a pool per session (ONNX Runtime's default), each session's workers spin for a while after
    its run, and a session run right after another one's competes with them for the cores: GPT's
    prefill and in-place step graphs, the translator's encoder and decoder, and every model of the
    service alternate all the time. On 2 cores, a 16-row GPT step alternating with the prefill
    session cost 2.4 ms against 1.1 ms alone; with one shared pool, 1.3 ms. It is process-wide and
    ONNX Runtime then refuses sessions with their own threads, so only the process's owner
    (``python -m service``) turns it on, before any session exists; sessions then ignore
    ``intra_op_threads`` and spinning (the pool's own sizes count). Returns whether it took.
    """
    global _shared_pool
    from onnxruntime.capi import _pybind_state

    try:
        _pybind_state.set_global_thread_pool_sizes(intra_op_threads, inter_op_threads)
    except Exception as exc:  # an older ONNX Runtime, or an environment already made: keep per-session pools
        log.warning("ONNX Runtime's shared thread pool is unavailable, sessions keep their own: %s", exc)
        return False
    _shared_pool = True
    log.info(
        "ONNX Runtime sessions share one thread pool (%s intra-op threads)",
        intra_op_threads or "one per core",
    )
    return True


def shared_thread_pool_in_use() -> bool:
    return _shared_pool


def _session_options(options: RuntimeOptions) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if _shared_pool:  # the pool's sizes count (ONNX Runtime warns about a session's own)
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = options.intra_op_threads
        so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[options.graph_optimization]
    if not options.spinning:  # threads that spin between operators take the cores the event loop needs
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3  # errors only: the CUDA probe on a CPU machine is not news
    return so


_cuda_usable: bool | None = None  # learnt from the first session that tries CUDA
TENSORRT = "TensorrtExecutionProvider"


def default_tensorrt_cache_dir() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "transformer-serving-tensorrt")


def cuda_provider_options(options: RuntimeOptions) -> dict[str, Any]:
    """The CUDA provider's options: the device, no TF32 (the graphs are exported and parity-checked in fp32;
    TF32 matmuls would drift from that), and ``enable_cuda_graph`` where this session's shapes repeat."""
    found: dict[str, Any] = {"device_id": options.cuda_device_id, "use_tf32": 0}
    if options.cuda_graphs:
        found["enable_cuda_graph"] = "1"
    return found


def tensorrt_profile(inputs: list[Any], max_rows: int, max_length: int) -> dict[str, str]:
    """TensorRT's one optimization profile for a graph's inputs (``session.get_inputs()``-like: name, shape):
    1 row and 1 token at least, ``max_rows`` rows and ``max_length`` tokens at most, the optimum at the largest
    batch of typical texts (a quarter of the window). Fixed dims stay as they are. Without a profile TensorRT
    builds an engine for each new range of shapes it sees, each costing seconds while requests wait."""

    def shape(rows: int, tokens: int, spec: Any) -> str:
        dims = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int):
                dims.append(dim)
            else:
                dims.append(rows if axis == 0 else tokens)
        return f"{spec.name}:" + "x".join(str(d) for d in dims)

    def joined(rows: int, tokens: int) -> str:
        return ",".join(shape(rows, tokens, spec) for spec in inputs)

    return {
        "trt_profile_min_shapes": joined(1, 1),
        "trt_profile_opt_shapes": joined(max_rows, max(1, max_length // 4)),
        "trt_profile_max_shapes": joined(max_rows, max_length),
    }


def tensorrt_provider_options(
    options: RuntimeOptions, profile: dict[str, str] | None = None
) -> dict[str, Any]:
    """The TensorRT provider's options: fp16 kernels, the engine and timing caches on disk (a restart loads
    the engine instead of building it again), and the shape profile when one is known."""
    cache = options.tensorrt_cache_dir or default_tensorrt_cache_dir()
    found: dict[str, Any] = {
        "device_id": options.cuda_device_id,
        "trt_fp16_enable": "True",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": cache,
    }
    return {**found, **(profile or {})}


def providers_for(
    options: RuntimeOptions, want_cuda: bool, profile: dict[str, str] | None = None
) -> list[Any]:
    """The execution providers a session asks for, most wanted first; CPU always last."""
    if not want_cuda:
        return [CPU]
    cuda = (CUDA, cuda_provider_options(options))
    if options.tensorrt:
        return [(TENSORRT, tensorrt_provider_options(options, profile)), cuda, CPU]
    return [cuda, CPU]


def _preload_cuda_libraries() -> None:
    """Load CUDA/cuDNN from the nvidia-* pip packages when they are installed (ONNX Runtime's own helper)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        # It prints a line per library it cannot find: expected on CPU machines, so kept out of the logs.
        with (
            open(os.devnull, "w") as sink,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            try:
                preload(msvc=False)
            except Exception as exc:  # missing packages: the session falls back to CPU and says so
                log.debug("onnxruntime.preload_dlls() failed: %s", exc)


def expected_device(options: RuntimeOptions) -> ServingDevice:
    """Where sessions will run, as far as is known before creating one: the variant choice needs it.

    "cuda" when CUDA is asked for (or auto and onnxruntime-gpu is installed) and no session has
    fallen back yet; a model whose sessions then land on CPU after all is loaded again for CPU.
    """
    if options.device == "cpu" or CUDA not in ort.get_available_providers():
        return "cpu"
    if options.device == "auto" and _cuda_usable is False:
        return "cpu"
    return "cuda"


def create_session(path: Path, options: RuntimeOptions) -> ort.InferenceSession:
    global _cuda_usable
    want_cuda = options.device in ("auto", "cuda") and CUDA in ort.get_available_providers()
    if options.device == "auto" and _cuda_usable is False:
        want_cuda = False  # already known to fall back: skip the noisy probe for every further session
    profile = None
    if want_cuda and options.tensorrt:
        os.makedirs(options.tensorrt_cache_dir or default_tensorrt_cache_dir(), exist_ok=True)
        quick = _session_options(dataclasses.replace(options, graph_optimization="disable"))
        inputs = ort.InferenceSession(str(path), sess_options=quick, providers=[CPU]).get_inputs()
        profile = tensorrt_profile(inputs, options.max_batch_size, options.max_length or 1)
    providers = providers_for(options, want_cuda, profile)
    if want_cuda and _cuda_usable is None:
        ort.set_default_logger_severity(4)  # the failed CUDA library load is expected on CPU machines
        _preload_cuda_libraries()
    try:
        session = _open(path, options, providers)
    finally:
        ort.set_default_logger_severity(2)
    got = session.get_providers()
    if want_cuda and _cuda_usable is None:
        _cuda_usable = CUDA in got
        log.info(
            "ONNX Runtime providers in use: %s (CUDA %s)", got, "in use" if _cuda_usable else "unavailable"
        )
    if options.device == "cuda" and CUDA not in got:
        raise RuntimeError(f"DEVICE=cuda but ONNX Runtime could not use CUDA for {path} (providers: {got})")
    return session


def _open(path: Path, options: RuntimeOptions, providers: list[Any]) -> ort.InferenceSession:
    """The session; where a CUDA graph was asked for and ONNX Runtime refuses it (a node left on CPU behind a
    copy, a control-flow node), the same session without one, saying why."""
    so = _session_options(options)
    try:
        return ort.InferenceSession(str(path), sess_options=so, providers=providers)
    except Exception as exc:
        if not options.cuda_graphs:
            raise
        log.warning("%s: no CUDA graph (%s); running it without", path.name, exc)
        plain = dataclasses.replace(options, cuda_graphs=False)
        return ort.InferenceSession(str(path), sess_options=so, providers=providers_for(plain, True))


def _instance_options(options: RuntimeOptions) -> RuntimeOptions:
    """Each instance's options when there are several: its share of INTRA_OP_THREADS (0: every core the
    process may use), at least one. Measured on 2 cores (benchmarks/README.md, "Model instances"): two
    instances of one thread each served 1.15-1.30x as many requests at 8 and 32 clients as one session
    on both cores, and a lone request 0.67x as fast; every thread to each instance (idle ones sleeping)
    paid less under load (0.95-1.05x, and 0.78x with them spinning)."""
    if options.instances <= 1:
        return options
    return dataclasses.replace(
        options, intra_op_threads=instances.threads_each(options.intra_op_threads, options.instances)
    )


class Graph:
    """One ONNX graph and the provider it actually runs on: one session, or one per instance
    (``RuntimeOptions.instances``), each compute thread running its own (``service.engine.instances``)."""

    def __init__(self, path: Path, options: RuntimeOptions, capture_runs: bool = False) -> None:
        """``capture_runs``: an encoder whose ``run`` pads to buckets and replays CUDA graphs, where the
        session got one (``cuda_graphs.EncoderCapture``); the decoder's step graph binds its own."""
        self.path = path
        each = _instance_options(options)
        self._sessions: list[ort.InferenceSession] | None = [
            create_session(path, each) for _ in range(max(1, options.instances))
        ]
        self.provider = self.session.get_providers()[0]
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        cuda = self.session.get_provider_options().get(CUDA, {})
        self.cuda_graph = self.on_cuda and str(cuda.get("enable_cuda_graph", "0")).lower() in ("1", "true")
        self.device_id = int(cuda.get("device_id", options.cuda_device_id))
        self._captures: list[Any] | None = None
        if capture_runs and self.cuda_graph:
            from .cuda_graphs import EncoderCapture

            self._captures = [
                EncoderCapture(s, options.max_batch_size, options.max_length or None, "cuda", self.device_id)
                for s in self._sessions or []
            ]

    @property
    def session(self) -> ort.InferenceSession:
        """The session of the instance the calling thread runs."""
        if self._sessions is None:
            raise SessionFreedError(self.path.name)
        return self._sessions[instances.current() % len(self._sessions)]

    @property
    def instances(self) -> int:
        return len(self._sessions) if self._sessions is not None else 0

    @property
    def freed(self) -> bool:
        return self._sessions is None

    def free(self) -> None:
        """Drop the sessions (their memory goes with the last reference); running one afterwards raises."""
        self._sessions = None

    @property
    def on_cuda(self) -> bool:
        return self.provider == CUDA

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        if self._captures is not None:
            return self._captures[instances.current() % len(self._captures)].run(feeds, outputs)
        return self.session.run(outputs, feeds)


class RemoteGraph:
    """A graph whose sessions live in another process (the split service's engine): its path, provider and
    input and output names, for the pipeline that prepares its inputs and reads its outputs in a front
    end; running it here is a bug (``EngineError``)."""

    instances = 1
    on_cuda = False

    def __init__(self, path: Path, input_names: list[str], output_names: list[str], provider: str) -> None:
        self.path = path
        self.input_names = input_names
        self.output_names = output_names
        self.provider = provider
        self.freed = False

    def free(self) -> None:
        self.freed = True

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        from .errors import EngineError

        raise EngineError(f"{self.path.name} runs in the engine process, not in a front end")
