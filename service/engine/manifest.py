"""manifest.json, typed: the contract between export (writer) and service (reader).

``docs/MODEL_REPOSITORY.md`` describes every key. The export stage validates
what it writes against ``Manifest`` and the service parses each folder's
manifest into it once, at load; everything after that reads attributes, not
string keys. Descriptive sections that nothing in the service reads
(``architecture``, ``training``, ``export``, ``validation``, ...) are kept as
they are (``extra="allow"``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

FORMAT_VERSION = 1
MANIFEST = "manifest.json"

Task = Literal[
    "translation",
    "text-classification",
    "question-answering",
    "token-classification",
    "text-generation",
    "image-classification",
    "feature-extraction",
    "rerank",
]

# task -> graphs the folder must hold
TASK_GRAPHS: dict[str, tuple[str, ...]] = {
    "translation": ("encoder", "decoder"),
    "text-classification": ("model",),
    "question-answering": ("model",),
    "token-classification": ("model",),
    "text-generation": ("model",),
    "image-classification": ("model",),
    "feature-extraction": ("model",),
    "rerank": ("model",),
}
TEXT_TASKS = frozenset(TASK_GRAPHS) - {"image-classification"}
# task -> manifest sections it cannot run without
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "translation": (
        "max_sequence_length",
        "max_source_length",
        "max_target_length",
        "kv_cache",
        "cross_attention",
    ),
    "text-classification": ("max_sequence_length", "labels"),
    "question-answering": ("max_sequence_length", "qa"),
    "token-classification": ("max_sequence_length", "labels"),
    "text-generation": ("max_sequence_length", "kv_cache"),
    "image-classification": ("labels", "preprocessing"),
    "feature-extraction": ("max_sequence_length", "embedding"),
    "rerank": ("max_sequence_length",),
}

S = TypeVar("S")


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True)


class FileEntry(_Section):
    sha256: str
    bytes: int


class TensorSpec(_Section):
    name: str
    dtype: str
    shape: list[str | int]  # axis names in order; an integer is a fixed size


class GraphEntry(_Section):
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    parity_max_abs_diff: float | None = None  # torch vs ONNX Runtime, measured at export
    parity_tolerance: float | None = None


class KVCacheSpec(_Section):
    """A decoder's self-attention cache: one key and one value tensor per layer, (batch, heads, past, head_dim)."""

    num_layers: int
    num_heads: int
    head_dim: int
    dtype: str = "float32"
    axes: list[str] = ["batch", "num_heads", "past_sequence", "head_dim"]
    past_key: str = "past_key.{i}"
    past_value: str = "past_value.{i}"
    present_key: str = "present_key.{i}"
    present_value: str = "present_value.{i}"

    @property
    def past_names(self) -> list[str]:
        """Graph inputs: past_key.0, past_value.0, past_key.1, ..."""
        return [name.format(i=i) for i in range(self.num_layers) for name in (self.past_key, self.past_value)]

    @property
    def present_names(self) -> list[str]:
        """Graph outputs, in the order of ``past_names``."""
        return [
            name.format(i=i)
            for i in range(self.num_layers)
            for name in (self.present_key, self.present_value)
        ]

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.dtype)


class CrossAttentionSpec(_Section):
    """The translator's encoder outputs: every decoder layer's cross-attention keys/values, and the mask input."""

    num_layers: int
    axes: list[str]
    key: str = "cross_key.{i}"
    value: str = "cross_value.{i}"
    mask_input: str = "encoder_attention_mask"

    @property
    def names(self) -> list[str]:
        return [name.format(i=i) for i in range(self.num_layers) for name in (self.key, self.value)]


class QASpec(_Section):
    stride: int  # overlap between windows, in tokens
    max_question_length: int
    max_answer_length: int
    # How the best span is chosen and scored: "logits" (the house's: the highest start + end logit over
    # every window, scored p(start) * p(end) under the window's softmax), or "context_probabilities"
    # (transformers' question-answering pipeline, kept for imported checkpoints: each window's softmax
    # over its context tokens and [CLS], the highest p(start) * p(end) over every window)
    span_score: Literal["logits", "context_probabilities"] = "logits"


class TaggingSpec(_Section):
    """How a token-classification head's tags become entities."""

    scheme: str = "BIO"
    label_on: str | None = None  # in words: which token carries a word's tag
    # "first": each word takes its first sub-token's tag (the house's training); "simple": every token
    # keeps its own tag and score and runs of one entity type group (transformers' aggregation "simple")
    aggregation: Literal["first", "simple"] = "first"


class Preprocessing(_Section):
    """How the ViT's training images were prepared; serving does exactly the same."""

    color_mode: str
    image_size: tuple[int, int]  # (height, width)
    resample: str
    scale: float
    mean: list[float]
    std: list[float]
    layout: str = "NCHW"
    note: str | None = None


class EmbeddingSpec(_Section):
    """A sentence embedder's graph outputs: one vector per text, L2-normalised and before normalisation."""

    dimensions: int
    pooling: Literal["mean"] = "mean"  # over real tokens (attention mask), as Sentence-BERT
    normalized_output: str = "sentence_embedding"
    pooled_output: str = "mean_pooled"


class AttentionMapsSpec(GraphEntry):
    """``attention.onnx``: the fp32 reference graph exported with attention probabilities as outputs.

    Written by ``model_export/attention_graphs.py`` beside the served graphs, never optimized (not in
    ``graphs``, so no variant has it); the service opens it only for requests with ``return_attention``.
    One output per layer, ``output.format(i=layer)``, shaped (batch, num_heads, queries, keys), each
    row a softmax over the keys. ``kind``: "cross" (translator: target positions over source tokens;
    inputs ``input_ids``, ``attention_mask``, ``decoder_input_ids``) or "self" (BERT: tokens over
    tokens; ViT: [CLS] + patches over the same, row 0 is [CLS]).
    """

    kind: Literal["cross", "self"]
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    output: str = "attention.{i}"

    @property
    def output_names(self) -> list[str]:
        return [self.output.format(i=i) for i in range(self.num_layers)]


Precision = Literal["fp32", "int8", "fp16"]
Device = Literal["cpu", "cuda"]
VARIANT_NAMES = ("fused", "int8", "fp16")  # besides the reference: the fp32 graphs exactly as exported


class Variant(_Section):
    """An optimized copy of the model's graphs, written by ``python -m model_export variants``.

    The reference (``Manifest.graphs``: fp32, unfused, exactly as exported and parity-checked against
    torch) always stays; a variant has the same graph names, inputs and outputs, in other files. Its
    validation metrics are measured on the same split as the reference's, and ``serve_by_default``
    says whether it passed the accuracy rule (``tolerance``: the largest allowed drop of ``metric``),
    and for int8 whether it was also faster than fused where it was built (``speed_over_fused``).
    The service serves, per device, the first variant of its preference order that lists the device
    and is ``serve_by_default`` (``service.engine.repository``); MODEL_VARIANT overrides.
    """

    graphs: dict[str, str]  # graph name (as in Manifest.graphs) -> file
    precision: Precision
    fused: bool  # attention / LayerNorm / GELU fused (op counts in ``op_counts``)
    devices: list[Device]  # where it may run
    method: str  # how it was made, in words (tool, options)
    op_counts: dict[str, dict[str, int]] = Field(default_factory=dict)  # graph -> op type -> count
    metric: str | None = None  # the validation metric the rule compares (e.g. "accuracy", "bleu")
    validation: dict[str, float] | None = None  # this variant's metrics (None: not measured here)
    delta: dict[str, float] | None = None  # variant - reference, per metric
    tolerance: float | None = None  # the largest allowed drop of ``metric``
    parity_max_abs_diff: float | None = None  # vs the reference graphs, on the parity inputs
    batch_max_abs_diff: float | None = None  # a row run in a batch vs the same row alone
    # int8: its speed over the fused graphs' on the machine that built it, at the service's shapes
    # (``model_export/variant_speed.py``); served by default only where it is also faster
    speed_over_fused: float | None = None
    serve_by_default: bool = False
    reason: str = ""  # why it is (or is not) served by default, in words
    # Decoders only: graph name -> a decoding-step graph of this variant whose KV cache is a preallocated
    # buffer updated in place (``model_export/inplace_kv.py``; CPU), and its largest difference from this
    # variant's own Concat step on the same past (logits and the new keys/values)
    inplace_decode: dict[str, str] = Field(default_factory=dict)
    inplace_max_abs_diff: float | None = None


class Manifest(BaseModel):
    """One model folder's manifest.json."""

    model_config = ConfigDict(extra="allow", frozen=True)

    format_version: int
    name: str | None = None  # must equal the folder name (checked at load)
    task: Task
    version: str  # content hash of the served files
    files: dict[str, FileEntry]
    graphs: dict[str, GraphEntry]
    architecture: str | None = None
    description: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    labels: list[str] | None = None
    max_sequence_length: int | None = None
    max_source_length: int | None = None
    max_target_length: int | None = None
    special_tokens: dict[str, int] = Field(default_factory=dict)
    source_suffix: list[int] | None = None
    kv_cache: KVCacheSpec | None = None
    cross_attention: CrossAttentionSpec | None = None
    qa: QASpec | None = None
    preprocessing: Preprocessing | None = None
    embedding: EmbeddingSpec | None = None
    tagging: TaggingSpec | None = None
    # Translation: token ids never generated (an imported Marian checkpoint's bad_words_ids: its <pad>)
    suppress_tokens: list[int] = Field(default_factory=list)
    # Translation: the last step the length limit allows emits eos (transformers' forced_eos_token_id)
    forced_eos: bool = False
    attention_maps: AttentionMapsSpec | None = None  # optional: attention.onnx (return_attention)
    # Text generation: the checkpoint's Jinja2 chat template (tokenizer_config.json's), for chat completions
    chat_template: str | None = None
    variants: dict[str, Variant] = Field(default_factory=dict)  # name (VARIANT_NAMES) -> variant

    @model_validator(mode="after")
    def _task_sections(self) -> Manifest:
        missing = [g for g in TASK_GRAPHS[self.task] if g not in self.graphs]
        if missing:
            raise ValueError(f"task {self.task} needs graphs {missing}")
        absent = [s for s in TASK_SECTIONS[self.task] if getattr(self, s) is None]
        if absent:
            raise ValueError(f"task {self.task} needs {', '.join(absent)}")
        for name, variant in self.variants.items():
            if name not in VARIANT_NAMES:
                raise ValueError(f"unknown variant {name!r} (known: {', '.join(VARIANT_NAMES)})")
            if set(variant.graphs) != set(self.graphs):
                raise ValueError(
                    f"variant {name} has graphs {sorted(variant.graphs)}, not {sorted(self.graphs)}"
                )
            unlisted = [
                f for f in (*variant.graphs.values(), *variant.inplace_decode.values()) if f not in self.files
            ]
            if unlisted:
                raise ValueError(f"variant {name}: files {unlisted} are not in the manifest's files")
        maps = self.attention_maps
        if maps is not None:
            if maps.file not in self.files:
                raise ValueError(f"attention_maps file {maps.file} is not in the manifest's files")
            if [o.name for o in maps.outputs] != maps.output_names:
                raise ValueError(f"attention_maps outputs are not {maps.output_names}")
        return self

    @property
    def decoder_start(self) -> int:
        """The token a translation's decoding starts from: ``decoder_start`` where the checkpoint names one
        (Marian: its <pad>), else ``bos``."""
        return self.special_tokens.get("decoder_start", self.token("bos"))

    def token(self, name: str) -> int:
        """A special token's id (``pad``, ``eos``, ...); a manifest without it is a broken export."""
        assert name in self.special_tokens, f"manifest of {self.name} has no special token {name!r}"
        return self.special_tokens[name]


def required(section: S | None) -> S:
    """A section the model's task requires: ``Manifest`` has checked it is there (``TASK_SECTIONS``)."""
    assert section is not None, "a section the task requires is missing (Manifest checks this at load)"
    return section


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_version(files: dict[str, Any]) -> str:
    """The model version: a hash over the served files' hashes, so new weights always mean a new version."""
    joined = "".join(f"{name}:{_sha256_of(entry)}\n" for name, entry in sorted(files.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def _sha256_of(entry: Any) -> str:
    return str(entry.sha256 if isinstance(entry, FileEntry) else entry["sha256"])
