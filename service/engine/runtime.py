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
    # use_tf32=0: the graphs are exported and parity-checked in fp32; TF32 matmuls would drift from that.
    cuda_options = {"device_id": options.cuda_device_id, "use_tf32": 0}
    providers: list[Any] = [(CUDA, cuda_options), CPU] if want_cuda else [CPU]
    if want_cuda and _cuda_usable is None:
        ort.set_default_logger_severity(4)  # the failed CUDA library load is expected on CPU machines
        _preload_cuda_libraries()
    try:
        session = ort.InferenceSession(str(path), sess_options=_session_options(options), providers=providers)
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

    def __init__(self, path: Path, options: RuntimeOptions) -> None:
        self.path = path
        each = _instance_options(options)
        self._sessions: list[ort.InferenceSession] | None = [
            create_session(path, each) for _ in range(max(1, options.instances))
        ]
        self.provider = self.session.get_providers()[0]
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

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
        return self.session.run(outputs, feeds)
