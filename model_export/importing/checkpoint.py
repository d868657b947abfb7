"""Reading a Hugging Face checkpoint folder: which family and head it is, and whether it can be served exactly.

``inspect(folder, task)`` reads ``config.json`` (and, for the task, the tokenizer's, image
processor's, generation and sentence-transformers files: an embedder's modules, a CrossEncoder's
activation) and returns a ``Checkpoint``, or raises ``ImportRefused`` naming what is missing or what
the served graphs would ignore. Nothing here loads weights; ``load_model`` does, with
``transformers``' own class for the head.
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
    "rerank",
    "text-generation",
    "translation",
    "image-classification",
)
# the BERT family's tasks
ENCODER_TASKS = (
    "text-classification",
    "token-classification",
    "question-answering",
    "feature-extraction",
    "rerank",
)
# model_type -> the tasks it serves
FAMILIES: dict[str, tuple[str, ...]] = {
    "bert": ENCODER_TASKS,  # BERT and MiniLM (whose checkpoints are model_type bert)
    "distilbert": ENCODER_TASKS,
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
    "rerank": ("ForSequenceClassification",),  # with one label: a cross-encoder's logit
    "text-generation": ("LMHeadModel", "ForCausalLM"),
    "translation": ("MTModel", "ForConditionalGeneration"),
    "image-classification": ("ForImageClassification",),
}
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's numbers, as image processors store them
# The sentence-transformers modules served (modules.json's ``type``), by exact class path: a suffix
# match would let ``evil.models.Transformer`` through, and sentence-transformers imports what it names.
POOLING, NORMALIZE = "sentence_transformers.models.Pooling", "sentence_transformers.models.Normalize"
SENTENCE_MODULES = ("sentence_transformers.models.Transformer", POOLING, NORMALIZE)
# A sentence-transformers CrossEncoder folder: its one module, the transformers model itself (the class
# path of sentence-transformers < 6, and of 6's modules.json), and the activation ``predict`` applies
# to the logit, by the names each version saved it under. Only the sigmoid (its default for one
# label) is what the service answers.
CROSS_ENCODER_MODULES = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.base.modules.transformer.Transformer",
)
SIGMOID = ("torch.nn.modules.activation.Sigmoid", "torch.nn.Sigmoid")
IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")  # ms-marco cross-encoders declare it
# a declared activation -> the manifest's ``ranking.score``: what the service answers as the score
ACTIVATIONS = {**dict.fromkeys(SIGMOID, "sigmoid"), **dict.fromkeys(IDENTITY, "identity")}


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


def _read_json(folder: Path, name: str) -> Any:
    """The JSON value of ``folder/name`` (None when there is no such file); a file that is not JSON, or is
    nested too deeply to parse, is refused naming it."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except RecursionError as exc:
        raise ImportRefused(f"{name} is nested too deeply to read") from exc
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and json's errors are ValueErrors
        raise ImportRefused(f"{name} is not valid JSON: {exc}") from exc


def _json(folder: Path, name: str) -> dict[str, Any]:
    value = _read_json(folder, name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ImportRefused(f"{name} is not a JSON object (it is a {type(value).__name__})")
    return value


def whole(config: dict[str, Any], key: str, file: str = "config.json", minimum: int = 1) -> int:
    """``config[key]`` as an integer of at least ``minimum``: missing, of another type, or smaller is
    refused naming the file and the field."""
    if key not in config:
        raise ImportRefused(f"{file} has no {key}: the served graphs need it")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ImportRefused(f"{file} {key} is {value!r}: expected an integer of at least {minimum}")
    return value


def _whole_or(config: dict[str, Any], key: str, default: int, minimum: int = 0) -> int:
    return whole(config, key, minimum=minimum) if config.get(key) is not None else default


def _labels(config: dict[str, Any], task: str) -> list[str] | None:
    if task not in ("text-classification", "token-classification", "image-classification"):
        return None
    id2label = config.get("id2label")
    if not id2label:
        raise ImportRefused(f"config.json has no id2label: {task} needs the names of its classes")
    if not isinstance(id2label, dict):
        raise ImportRefused(f"config.json id2label is a {type(id2label).__name__}: expected an object")
    keys = [k for k in id2label if not (isinstance(k, str) and k.strip().lstrip("-").isdigit())]
    if keys:
        raise ImportRefused(f"config.json id2label key {keys[0]!r} is not a class number")
    names = [v for v in id2label.values() if not isinstance(v, str)]
    if names:
        raise ImportRefused(f"config.json id2label value {names[0]!r} is not a label name")
    ids = sorted(int(k) for k in id2label)
    if ids != list(range(len(ids))):
        raise ImportRefused(f"config.json id2label keys {ids} are not 0..{len(ids) - 1}")
    return [str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in ids]


def _dims(family: str, config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(vocab, hidden, layers, heads) under each family's own config names."""
    names = {
        "distilbert": ("vocab_size", "dim", "n_layers", "n_heads"),
        "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head"),
        "marian": ("vocab_size", "d_model", "decoder_layers", "decoder_attention_heads"),
    }.get(family, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
    if family == "marian" and config.get("encoder_attention_heads") != config.get("decoder_attention_heads"):
        raise ImportRefused(
            "config.json: encoder_attention_heads and decoder_attention_heads differ; the served "
            "cross-attention layout takes one head count"
        )
    vocab_name, *others = names
    vocab = _whole_or(config, vocab_name, 0) if family == "vit" else whole(config, vocab_name)  # ViT has none
    hidden, layers, heads = (whole(config, name) for name in others)
    if hidden % heads:
        raise ImportRefused(f"config.json {others[0]} {hidden} is not a multiple of {others[2]} {heads}")
    return vocab, hidden, layers, heads


def num_labels(config: dict[str, Any]) -> int:
    """The head's size as ``transformers`` reads config.json: ``num_labels``, else ``id2label``'s size, else
    its default of 2."""
    if config.get("num_labels") is not None:
        return whole(config, "num_labels")
    id2label = config.get("id2label")
    if id2label is None:
        return 2
    if not isinstance(id2label, dict):
        raise ImportRefused(f"config.json id2label is a {type(id2label).__name__}: expected an object")
    return len(id2label)


def _refuse_ignored_fields(family: str, task: str, config: dict[str, Any]) -> None:
    """Config fields whose meaning the served graphs or pipelines would not honour."""
    problem = config.get("problem_type")
    if task == "text-classification" and problem not in (None, "single_label_classification"):
        raise ImportRefused(
            f"config.json problem_type is {problem!r}: the service serves softmax probabilities over "
            "single-label classes (single_label_classification)"
        )
    if task == "text-classification" and len(config.get("id2label") or {}) < 2:
        raise ImportRefused(
            "config.json id2label has fewer than 2 labels: a regression head, not classes "
            "(a one-logit cross-encoder imports with --task rerank)"
        )
    if task == "rerank":
        labels = num_labels(config)
        if labels != 1:
            read = "" if config.get("num_labels") is not None else " (id2label's size)"
            raise ImportRefused(
                f"config.json num_labels is {labels}{read}: a rerank cross-encoder answers one logit per (query, "
                "document) pair (num_labels 1); a classifier of several labels imports with --task "
                "text-classification"
            )
        if family == "bert" and _whole_or(config, "type_vocab_size", 2) < 2:
            raise ImportRefused(
                f"config.json type_vocab_size is {config['type_vocab_size']}: a pair's document is segment 1 "
                "(token_type_ids 1), which the model has no embedding for"
            )
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
    if (
        not processor.get("do_resize", True)
        or not isinstance(size, dict)
        or not all(isinstance(size.get(side), int) and size[side] > 0 for side in ("height", "width"))
    ):
        raise ImportRefused(
            "preprocessor_config.json size must be {height, width} with do_resize: the service resizes every "
            f"image to the model's size (got size {size})"
        )
    resample = processor.get("resample", 2)
    if isinstance(resample, bool) or not isinstance(resample, int) or resample not in RESAMPLE:
        raise ImportRefused(
            f"preprocessor_config.json resample {processor.get('resample')}: served are "
            f"{', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}"
        )


def _sentence_transformers(folder: Path) -> dict[str, Any]:
    """A sentence-transformers folder's pooling and normalisation; {} for a plain checkpoint."""
    entries = _read_json(folder, "modules.json")
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise ImportRefused(f"modules.json is a JSON {type(entries).__name__}: expected a list of modules")
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ImportRefused(f"modules.json [{n}] has no type: each module is an object with a class path")
        if entry["type"] not in SENTENCE_MODULES:  # by exact name: nothing of another package's is imported
            raise ImportRefused(
                f"modules.json [{n}] type {entry['type']!r} is not one of sentence-transformers' own "
                f"{', '.join(SENTENCE_MODULES)}"
            )
        path = entry.get("path", "")
        if not isinstance(path, str) or Path(path).is_absolute() or ".." in Path(path).parts:
            raise ImportRefused(f"modules.json [{n}] path {path!r} is not a folder inside the checkpoint")
    kinds = [entry["type"] for entry in entries]
    pooling_entry = next((m for m in entries if m["type"] == POOLING), None)
    if pooling_entry is not None and not pooling_entry.get("path"):
        raise ImportRefused("modules.json: the Pooling module has no path (its folder's config.json)")
    where = f"{pooling_entry['path']}/config.json" if pooling_entry else ""
    pooling = _json(folder, where) if pooling_entry else {}
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
    if pooling and modes != ["pooling_mode_mean_tokens"]:
        raise ImportRefused(
            f"{where} pools by {modes}: the served graph pools by the mean over real tokens "
            "(pooling_mode_mean_tokens) alone"
        )
    return {
        "modules": kinds,
        "normalize": NORMALIZE in kinds,
        **_json(folder, "sentence_bert_config.json"),
    }


def _activation(value: Any, where: str) -> str | None:
    """A CrossEncoder's declared activation: None (sentence-transformers' default, the sigmoid for one
    label), the sigmoid or the identity; any other is refused naming ``where``, since the service answers
    one of those two (``ACTIVATIONS``)."""
    if value is None or value in ACTIVATIONS:
        return None if value is None else str(value)
    raise ImportRefused(
        f"{where} is {value!r}: sentence-transformers' CrossEncoder would apply it to the logit, and the "
        f"service answers the logit's sigmoid ({SIGMOID[0]}) or the logit itself ({IDENTITY[0]})"
    )


def _cross_encoder(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """What a sentence-transformers ``CrossEncoder`` folder adds to a plain checkpoint: its activation (every
    version's field: config.json's ``sbert_ce_default_activation_function`` before 4.0, its
    ``sentence_transformers.activation_fn`` since, ``config_sentence_transformers.json``'s
    ``activation_fn`` in 6), its one module, and ``sentence_bert_config.json`` (``max_seq_length``);
    {} for a plain checkpoint."""
    found: dict[str, Any] = {}
    declared = [
        (
            "config.json sbert_ce_default_activation_function",
            config.get("sbert_ce_default_activation_function"),
        ),
    ]
    nested = config.get("sentence_transformers")
    if nested is not None:
        if not isinstance(nested, dict):
            raise ImportRefused(f"config.json sentence_transformers is {nested!r}: expected an object")
        declared.append(("config.json sentence_transformers.activation_fn", nested.get("activation_fn")))
    st_config = _json(folder, "config_sentence_transformers.json")
    if st_config:
        kind = st_config.get("model_type")
        if kind not in (None, "CrossEncoder"):
            raise ImportRefused(
                f"config_sentence_transformers.json model_type is {kind!r}: a rerank import is a CrossEncoder"
            )
        if st_config.get("default_prompt_name") is not None:
            raise ImportRefused(
                f"config_sentence_transformers.json default_prompt_name is {st_config['default_prompt_name']!r}: "
                "the service prepends no prompt to the query"
            )
        declared.append(("config_sentence_transformers.json activation_fn", st_config.get("activation_fn")))
    for where, value in declared:
        if (name := _activation(value, where)) is not None:
            found["activation_fn"] = name
    entries = _read_json(folder, "modules.json")
    if entries is not None:
        if not isinstance(entries, list) or len(entries) != 1:
            count = (
                f"{len(entries)} modules" if isinstance(entries, list) else f"a JSON {type(entries).__name__}"
            )
            raise ImportRefused(
                f"modules.json holds {count}: a served CrossEncoder is its transformers model alone (one "
                f"module, {' or '.join(CROSS_ENCODER_MODULES)}); a Dense or other module after it would "
                "change its score"
            )
        entry = entries[0]
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind not in CROSS_ENCODER_MODULES:  # by exact name: nothing of another package's is imported
            raise ImportRefused(
                f"modules.json [0] type {kind!r} is not sentence-transformers' own "
                f"{' or '.join(CROSS_ENCODER_MODULES)}"
            )
        if entry.get("path", "") not in ("", "."):
            raise ImportRefused(
                f"modules.json [0] path {entry.get('path')!r}: the CrossEncoder's model is the checkpoint folder itself"
            )
        found["modules"] = [kind]
    bert_config = _json(folder, "sentence_bert_config.json")
    task = bert_config.get("transformer_task")
    if task not in (None, "sequence-classification"):
        raise ImportRefused(
            f"sentence_bert_config.json transformer_task is {task!r}: a cross-encoder's is sequence-classification"
        )
    return {**bert_config, **found}


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
    if not isinstance(family, str) or family not in FAMILIES:
        raise ImportRefused(
            f"config.json model_type {family!r} is not a family the import serves exactly "
            f"({', '.join(FAMILIES)})"
        )
    if task not in FAMILIES[family]:
        raise ImportRefused(f"a {family} checkpoint serves {', '.join(FAMILIES[family])}, not {task}")
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ImportRefused(f"config.json architectures is {architectures!r}: expected a list of class names")
    architecture = architectures[0] if architectures else ""
    heads = HEADS[task]
    if heads is not None and not architecture.endswith(heads):
        raise ImportRefused(
            f"config.json architectures {architectures} has no {task} head (a class ending in {' or '.join(heads)})"
        )
    labels = _labels(config, task)
    _refuse_ignored_fields(family, task, config)
    vocab, hidden, layers, heads_count = _dims(family, config)
    checkpoint = Checkpoint(
        folder=folder,
        task=task,
        family=family,
        config=config,
        architecture=architecture or family,
        labels=labels,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads_count,
        segments=family == "bert" and _whole_or(config, "type_vocab_size", 2) > 0,
        tokenizer_config=_json(folder, "tokenizer_config.json"),
        generation=_json(folder, "generation_config.json"),
    )
    if task == "image-classification":
        for key in ("image_size", "patch_size"):
            whole(config, key)
        _whole_or(config, "num_channels", 3, minimum=1)
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
    if task == "rerank":
        checkpoint.sentence_transformers = _cross_encoder(folder, config)
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
        "rerank": transformers.AutoModelForSequenceClassification,
        "text-generation": transformers.AutoModelForCausalLM,
        "translation": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }
    model = classes[checkpoint.task].from_pretrained(
        str(checkpoint.folder), attn_implementation="eager", dtype="float32"
    )
    return exportable(model)
