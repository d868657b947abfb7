"""What a peer server does per request, the service's way: tokenize, ONNX Runtime on the fused graph, softmax.

Standalone (numpy, onnxruntime and tokenizers only) so that it runs in the peers' venv. It mirrors,
step by step, ``service.pipelines.classify.TextClassifier`` (tokenizers' ``encode``, the cut to the
model's window keeping [SEP], right-padded int64 batches, softmax in float64, the top label) and the
session options of ``service.engine.runtime`` (INTRA_OP_THREADS, INTER_OP_THREADS, INTRA_OP_SPINNING,
every graph optimization); ``tests/test_benchmarks.py`` checks that it answers as the service does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
import onnxruntime as ort
from tokenizers import Tokenizer

VARIANT = "fused"  # what the service serves on CPU by default (benchmarks/peers.py pins MODEL_VARIANT)
READY_PATH = "/health/ready"  # what harness.service_process polls
CLASSIFY_PATH = "/v1/classify"


@dataclass(frozen=True)
class PeerSettings:
    """A peer server's settings, from the environment benchmarks/peers.py gives it (the service's names)."""

    model_dir: Path
    host: str
    port: int
    intra_op_threads: int
    inter_op_threads: int
    intra_op_spinning: bool
    max_batch_size: int
    batch_timeout_s: float
    variant: str = VARIANT  # PEER_VARIANT: which of the manifest's variants (the GPU table: fp16)
    device: str = "cpu"  # PEER_DEVICE: cuda runs the graph on ONNX Runtime's CUDA provider

    @classmethod
    def from_env(cls) -> PeerSettings:
        return cls(
            model_dir=Path(os.environ["MODEL_DIR"]),
            host=os.environ.get("HOST", "127.0.0.1"),
            port=int(os.environ.get("PORT", "8000")),
            intra_op_threads=int(os.environ.get("INTRA_OP_THREADS", "0")),
            inter_op_threads=int(os.environ.get("INTER_OP_THREADS", "1")),
            intra_op_spinning=os.environ.get("INTRA_OP_SPINNING", "true").lower()
            not in ("0", "false", "no", "off"),
            max_batch_size=int(os.environ.get("MAX_BATCH_SIZE", "32")),
            batch_timeout_s=float(os.environ.get("BATCH_TIMEOUT_MS", "0")) / 1000,
            variant=os.environ.get("PEER_VARIANT", VARIANT),
            device=os.environ.get("PEER_DEVICE", "cpu"),
        )


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # what the model sees: special tokens included, cut to its window
    truncated: bool


class FusedClassifier:
    """One model folder's fused graph, tokenizer and labels."""

    def __init__(
        self,
        model_dir: Path,
        intra_op_threads: int = 0,
        inter_op_threads: int = 1,
        spinning: bool = True,
        variant_name: str = VARIANT,
        device: str = "cpu",
    ) -> None:
        manifest = json.loads((model_dir / "manifest.json").read_text())
        variant = manifest.get("variants", {}).get(variant_name)
        assert variant is not None, (
            f"{model_dir} has no {variant_name} variant: run `python -m model_export variants`"
        )
        self.name = model_dir.name
        self.labels: list[str] = manifest["labels"]
        self.max_len: int = manifest["max_sequence_length"]
        self.pad_id: int = manifest["special_tokens"]["pad"]
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = inter_op_threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not spinning:  # INTRA_OP_SPINNING=false, as the service reads it
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        so.log_severity_level = 3
        path = model_dir / variant["graphs"]["model"]
        providers: list[object] = ["CPUExecutionProvider"]
        if device == "cuda":  # as the service opens it on CUDA (service.engine.runtime): no TF32
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0}))
        self.session = ort.InferenceSession(str(path), sess_options=so, providers=providers)
        if device == "cuda" and self.session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"PEER_DEVICE=cuda but {path} runs on {self.session.get_providers()}")
        self.input_names = [i.name for i in self.session.get_inputs()]

    @classmethod
    def from_settings(cls, settings: PeerSettings) -> FusedClassifier:
        return cls(
            settings.model_dir,
            settings.intra_op_threads,
            settings.inter_op_threads,
            settings.intra_op_spinning,
            settings.variant,
            settings.device,
        )

    def encode(self, text: str) -> Encoded:
        ids = self.tokenizer.encode(text).ids
        if len(ids) <= self.max_len:
            return Encoded(ids, False)
        return Encoded([*ids[: self.max_len - 1], ids[-1]], True)  # keep the final [SEP]

    def probabilities(self, batch: Sequence[Encoded]) -> np.ndarray:
        """(B, labels) float64: one right-padded batch through the graph, then softmax."""
        length = max(len(e.ids) for e in batch)
        ids = np.full((len(batch), length), self.pad_id, dtype=np.int64)  # (B, T)
        mask = np.zeros((len(batch), length), dtype=np.int64)  # (B, T)
        for i, e in enumerate(batch):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        logits = self.session.run(None, {name: feeds[name] for name in self.input_names})[0]  # (B, labels)
        x = np.asarray(logits, dtype=np.float64)
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)

    def answer(self, encoded: Encoded, probs: np.ndarray) -> dict[str, Any]:
        """The JSON body: the service's shape for one text and top_k 1."""
        best = int(np.argsort(-probs, kind="stable")[0])
        label, score = self.labels[best], float(probs[best])
        return {
            "model": self.name,
            "results": [
                {
                    "label": label,
                    "score": score,
                    "labels": [{"label": label, "score": score}],
                    "truncated": encoded.truncated,
                }
            ],
            "usage": {"input_tokens": len(encoded.ids)},
        }
