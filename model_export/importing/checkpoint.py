"""Reading a Hugging Face checkpoint folder: which family and head it is, and whether it can be served exactly.

``inspect(folder, task)`` reads ``config.json`` (and, for the task, the tokenizer's, image
processor's, generation and sentence-transformers files) and returns a ``Checkpoint``, or raises
``ImportRefused`` naming what is missing or what the served graphs would ignore. Nothing here loads
weights; ``load_model`` does, with ``transformers``' own class for the head.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASKS = (
    "text-classification",
    "token-classification",
    "question-answering",
    "feature-extraction",
    "text-generation",
    "translation",
    "image-classification",
)
# model_type -> the tasks it serves
FAMILIES: dict[str, tuple[str, ...]] = {
    "bert": ("text-classification", "token-classification", "question-answering", "feature-extraction"),
    "distilbert": ("text-classification", "token-classification", "question-answering", "feature-extraction"),
    "gpt2": ("text-generation",),
    "marian": ("translation",),
    "vit": ("image-classification",),
}
# task -> the head class name's ending in config.json's ``architectures`` (None: any, the base model is used)
HEADS: dict[str, tuple[str, ...] | None] = {
    "text-classification": ("ForSequenceClassification",),
    "token-classification": ("ForTokenClassification",),
    "question-answering": ("ForQuestionAnswering",),
    "feature-extraction": None,
    "text-generation": ("LMHeadModel", "ForCausalLM"),
    "translation": ("MTModel", "ForConditionalGeneration"),
    "image-classification": ("ForImageClassification",),
}
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's numbers, as image processors store them


class ImportRefused(ValueError):
    """The checkpoint cannot be served exactly: the message names the file or field and the reason."""


@dataclass
class Checkpoint:
    folder: Path
    task: str
    family: str  # config.json's model_type
    config: dict[str, Any]
    architecture: str
    labels: list[str] | None
    vocab_size: int
    hidden_size: int
    num_layers: int  # encoder layers (BERT, ViT), decoder layers (GPT-2, Marian)
    num_heads: int
    segments: bool  # takes token_type_ids
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)
    image_processor: dict[str, Any] = field(default_factory=dict)
    sentence_transformers: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def channels(self) -> int:
        return int(self.config.get("num_channels", 3))

    @property
    def image_size(self) -> int:
        return int(self.config["image_size"])

    @property
    def num_patches(self) -> int:
        return (self.image_size // int(self.config["patch_size"])) ** 2

    def origin(self) -> dict[str, Any]:
        """Where the served model comes from: the folder, its name, and a hash of its files."""
        files = sorted(p for p in self.folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
        digest = hashlib.sha256()
        for path in files:
            digest.update(f"{path.relative_to(self.folder)}:{_sha256(path)}\n".encode())
        return {
            "checkpoint": self.folder.name,
            "name_or_path": self.config.get("_name_or_path"),  # what config.json says it was made from
            "folder": str(self.folder.resolve()),
            "sha256": digest.hexdigest(),
            "files": [str(p.relative_to(self.folder)) for p in files],
            "architecture": self.architecture,
            "model_type": self.family,
            "transformers_version": self.config.get("transformers_version"),
        }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _json(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ImportRefused(f"{name} is not a JSON object: {exc}") from exc


def _labels(config: dict[str, Any], task: str) -> list[str] | None:
    if task not in ("text-classification", "token-classification", "image-classification"):
        return None
    id2label = config.get("id2label")
    if not id2label:
        raise ImportRefused(f"config.json has no id2label: {task} needs the names of its classes")
    ids = sorted(int(k) for k in id2label)
    if ids != list(range(len(ids))):
        raise ImportRefused(f"config.json id2label keys {ids} are not 0..{len(ids) - 1}")
    return [str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in ids]


def _dims(family: str, config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(vocab, hidden, layers, heads) under each family's own config names."""
    if family == "distilbert":
        return config["vocab_size"], config["dim"], config["n_layers"], config["n_heads"]
    if family == "gpt2":
        return config["vocab_size"], config["n_embd"], config["n_layer"], config["n_head"]
    if family == "marian":
        if config.get("encoder_attention_heads") != config.get("decoder_attention_heads"):
            raise ImportRefused(
                "config.json: encoder_attention_heads and decoder_attention_heads differ; the served "
                "cross-attention layout takes one head count"
            )
        return (
            config["vocab_size"],
            config["d_model"],
            config["decoder_layers"],
            config["decoder_attention_heads"],
        )
    vocab = config.get("vocab_size", 0)  # ViT has none
    return vocab, config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]


def _refuse_ignored_fields(family: str, task: str, config: dict[str, Any]) -> None:
    """Config fields whose meaning the served graphs or pipelines would not honour."""
    problem = config.get("problem_type")
    if task == "text-classification" and problem not in (None, "single_label_classification"):
        raise ImportRefused(
            f"config.json problem_type is {problem!r}: the service serves softmax probabilities over "
            "single-label classes (single_label_classification)"
        )
    if task == "text-classification" and len(config.get("id2label") or {}) < 2:
        raise ImportRefused("config.json id2label has fewer than 2 labels: a regression head, not classes")
    if family == "gpt2" and config.get("add_cross_attention"):
        raise ImportRefused(
            "config.json add_cross_attention is true: a GPT-2 decoder of an encoder, not a language model"
        )
    if family == "marian" and not config.get("share_encoder_decoder_embeddings", True):
        raise ImportRefused(
            "config.json share_encoder_decoder_embeddings is false (separate source and target vocabularies): "
            "the service decodes with the one tokenizer.json"
        )
    if family == "marian" and config.get("decoder_vocab_size") not in (None, config.get("vocab_size")):
        raise ImportRefused(
            "config.json decoder_vocab_size differs from vocab_size: separate target vocabulary"
        )


def _refuse_image_processor(processor: dict[str, Any]) -> None:
    if not processor:
        raise ImportRefused(
            "no preprocessor_config.json: image-classification needs the image processor's size and normalisation"
        )
    kind = processor.get("image_processor_type", "")
    if kind and not kind.startswith("ViTImageProcessor"):
        raise ImportRefused(
            f"preprocessor_config.json image_processor_type {kind!r}: only ViTImageProcessor is served"
        )
    if processor.get("do_center_crop") or (
        processor.get("crop_size") and processor.get("do_center_crop", True)
    ):
        raise ImportRefused("preprocessor_config.json asks for a center crop: the service resizes only")
    size = processor.get("size", {})
    if not processor.get("do_resize", True) or "height" not in size or "width" not in size:
        raise ImportRefused(
            "preprocessor_config.json size must be {height, width} with do_resize: the service resizes every "
            f"image to the model's size (got size {size})"
        )
    if processor.get("resample", 2) not in RESAMPLE:
        raise ImportRefused(
            f"preprocessor_config.json resample {processor.get('resample')}: served are "
            f"{', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}"
        )


def _sentence_transformers(folder: Path) -> dict[str, Any]:
    """A sentence-transformers folder's pooling and normalisation; {} for a plain checkpoint."""
    modules = folder / "modules.json"
    if not modules.is_file():
        return {}
    kinds = [m.get("type", "") for m in json.loads(modules.read_text())]
    pooling_entry = next(
        (m for m in json.loads(modules.read_text()) if m.get("type", "").endswith("Pooling")), None
    )
    pooling = _json(folder, f"{pooling_entry['path']}/config.json") if pooling_entry else {}
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
    if pooling and modes != ["pooling_mode_mean_tokens"]:
        raise ImportRefused(
            f"{pooling_entry and pooling_entry['path']}/config.json pools by {modes}: the served graph "
            "pools by the mean over real tokens (pooling_mode_mean_tokens) alone"
        )
    unknown = [
        k for k in kinds if not k.endswith(("models.Transformer", "models.Pooling", "models.Normalize"))
    ]
    if unknown:
        raise ImportRefused(f"modules.json has {unknown}: served are Transformer, mean Pooling and Normalize")
    return {
        "modules": kinds,
        "normalize": any(k.endswith("Normalize") for k in kinds),
        **_json(folder, "sentence_bert_config.json"),
    }


def inspect(folder: Path, task: str) -> Checkpoint:
    """The checkpoint in ``folder`` read for ``task``; ``ImportRefused`` names what stops an exact import."""
    if task not in TASKS:
        raise ImportRefused(f"task {task!r} is not one of {', '.join(TASKS)}")
    if not folder.is_dir():
        raise ImportRefused(f"{folder} is not a folder")
    config = _json(folder, "config.json")
    if not config:
        raise ImportRefused(f"{folder} has no config.json")
    if not any((folder / name).is_file() for name in WEIGHTS):
        raise ImportRefused(f"{folder} has no safetensors weights ({' or '.join(WEIGHTS)})")
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ImportRefused(
            f"config.json model_type {family!r} is not a family the import serves exactly "
            f"({', '.join(FAMILIES)})"
        )
    if task not in FAMILIES[family]:
        raise ImportRefused(f"a {family} checkpoint serves {', '.join(FAMILIES[family])}, not {task}")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else ""
    heads = HEADS[task]
    if heads is not None and not architecture.endswith(heads):
        raise ImportRefused(
            f"config.json architectures {architectures} has no {task} head (a class ending in {' or '.join(heads)})"
        )
    _refuse_ignored_fields(family, task, config)
    vocab, hidden, layers, heads_count = _dims(family, config)
    checkpoint = Checkpoint(
        folder=folder,
        task=task,
        family=family,
        config=config,
        architecture=architecture or family,
        labels=_labels(config, task),
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        num_layers=int(layers),
        num_heads=int(heads_count),
        segments=family == "bert" and int(config.get("type_vocab_size", 2)) > 0,
        tokenizer_config=_json(folder, "tokenizer_config.json"),
        generation=_json(folder, "generation_config.json"),
    )
    if task == "image-classification":
        checkpoint.image_processor = _json(folder, "preprocessor_config.json")
        _refuse_image_processor(checkpoint.image_processor)
        size = checkpoint.image_processor["size"]
        if (size["height"], size["width"]) != (checkpoint.image_size, checkpoint.image_size):
            raise ImportRefused(
                f"preprocessor_config.json size {size} differs from config.json image_size "
                f"{checkpoint.image_size}: the graph takes {checkpoint.image_size}x{checkpoint.image_size} images"
            )
    if task == "feature-extraction":
        checkpoint.sentence_transformers = _sentence_transformers(folder)
    return checkpoint


def load_model(checkpoint: Checkpoint) -> Any:
    """The checkpoint's ``transformers`` model for its task, in eval mode with ``house_attention``."""
    import transformers

    from .wrappers import exportable

    classes = {
        "text-classification": transformers.AutoModelForSequenceClassification,
        "token-classification": transformers.AutoModelForTokenClassification,
        "question-answering": transformers.AutoModelForQuestionAnswering,
        "feature-extraction": transformers.AutoModel,
        "text-generation": transformers.AutoModelForCausalLM,
        "translation": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }
    model = classes[checkpoint.task].from_pretrained(
        str(checkpoint.folder), attn_implementation="eager", dtype="float32"
    )
    return exportable(model)
