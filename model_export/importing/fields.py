"""The manifest of an imported checkpoint, from the checkpoint's own files (``docs/MODEL_REPOSITORY.md``).

Labels from ``id2label``; special tokens by the names the tokenizer's and the model's configs give
them; window lengths from ``model_max_length``, the position table and sentence-transformers'
``max_seq_length``; the image processor's size, resampling, scale and normalisation; the generation
defaults (``eos``, ``pad``, ``decoder_start_token_id``, Marian's ``bad_words_ids``); a chat template,
kept as text for the chat feature. A cross-encoder (rerank) has no labels: its one logit's sigmoid is
the score, as sentence-transformers' ``CrossEncoder`` answers.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from ..recipes.signatures import kv_cache_layout
from .checkpoint import ACTIVATIONS, RESAMPLE, Checkpoint, ImportRefused, whole
from .tokenizer import chat_template, token_id

QA_MAX_QUESTION = 64  # transformers' question-answering pipeline defaults
QA_MAX_ANSWER = 15
QA_MAX_STRIDE = 128
QA_MAX_WINDOW = 384
UNBOUNDED = 10**6  # a tokenizer_config model_max_length this large means "not set"


def _position_table(checkpoint: Checkpoint) -> int:
    config = checkpoint.config
    key = "max_position_embeddings" if config.get("max_position_embeddings") else "n_positions"
    return whole(config, key) if config.get(key) else 0


def _window(checkpoint: Checkpoint) -> int:
    """The longest token sequence served: the position table, the tokenizer's model_max_length, and for a
    sentence embedder or CrossEncoder its ``max_seq_length`` (what sentence-transformers cuts to)."""
    limits = [_position_table(checkpoint)]
    model_max = checkpoint.tokenizer_config.get("model_max_length")
    if isinstance(model_max, int) and 0 < model_max < UNBOUNDED:
        limits.append(model_max)
    seq = checkpoint.sentence_transformers.get("max_seq_length")
    if isinstance(seq, int) and seq > 0:
        limits.append(seq)
    return min(limit for limit in limits if limit > 0)


def _named(checkpoint: Checkpoint, key: str, default: str) -> str:
    value = checkpoint.tokenizer_config.get(key, default)
    return value.get("content", default) if isinstance(value, dict) else str(value)


def _bert_tokens(checkpoint: Checkpoint, tokenizer: Tokenizer) -> dict[str, int]:
    tokens = {
        name: token_id(tokenizer, _named(checkpoint, f"{name}_token", f"[{name.upper()}]"), name)
        for name in ("pad", "unk", "cls", "sep")
    }
    mask = tokenizer.token_to_id(_named(checkpoint, "mask_token", "[MASK]"))
    if mask is not None:
        tokens["mask"] = mask
    if checkpoint.task == "question-answering" and (
        tokenizer.token_to_id("[CLS]") is None or tokenizer.token_to_id("[SEP]") is None
    ):
        raise ImportRefused(
            "question-answering windows are [CLS] question [SEP] context [SEP]: the tokenizer lacks them"
        )
    return tokens


def _generation_id(checkpoint: Checkpoint, key: str) -> int | None:
    value = checkpoint.generation.get(key, checkpoint.config.get(key))
    if isinstance(value, list):  # several eos ids: the service stops at one
        if len(value) != 1:
            raise ImportRefused(f"{key} {value}: the service stops generation at one eos token")
        value = value[0]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ImportRefused(f"generation_config.json / config.json {key} is {value!r}: expected a token id")
    return value


def _suppressed(checkpoint: Checkpoint) -> list[int]:
    """Marian's ``bad_words_ids`` (its <pad>): single tokens the decoder never emits."""
    bad = checkpoint.generation.get("bad_words_ids", checkpoint.config.get("bad_words_ids")) or []
    if not isinstance(bad, list) or not all(
        isinstance(words, list) and all(isinstance(w, int) and not isinstance(w, bool) for w in words)
        for words in bad
    ):
        raise ImportRefused(f"bad_words_ids {bad!r}: expected a list of lists of token ids")
    if any(len(words) != 1 for words in bad):
        raise ImportRefused(f"bad_words_ids {bad}: only single-token entries are served (suppressed tokens)")
    if bad and checkpoint.task != "translation":
        raise ImportRefused(f"bad_words_ids {bad}: the generation engine suppresses no tokens")
    return [int(words[0]) for words in bad]


def _refuse_generation(checkpoint: Checkpoint) -> None:
    """Generation settings the served decoding would not honour (where they change greedy or beam tokens)."""
    generation = checkpoint.generation
    ignored = {
        "forced_bos_token_id": None,
        "no_repeat_ngram_size": 0,
        "encoder_no_repeat_ngram_size": 0,
        "suppress_tokens": None,
        "begin_suppress_tokens": None,
        "min_length": 0,
        "min_new_tokens": None,
        "repetition_penalty": 1.0,
    }
    for key, neutral in ignored.items():
        value = generation.get(key, checkpoint.config.get(key, neutral))
        if value is not None and value != neutral and value != []:
            raise ImportRefused(
                f"generation_config {key} = {value!r}: the served decoding does not apply it, so its tokens "
                "would differ from generate()'s"
            )
    forced = _generation_id(checkpoint, "forced_eos_token_id")
    if forced is not None and (
        checkpoint.task != "translation" or forced != _generation_id(checkpoint, "eos_token_id")
    ):
        raise ImportRefused(
            f"generation_config forced_eos_token_id = {forced}: served only for translation, as its eos"
        )


def _preprocessing(checkpoint: Checkpoint) -> dict[str, Any]:
    processor = checkpoint.image_processor
    channels = checkpoint.channels
    if channels not in (1, 3):
        raise ImportRefused(f"config.json num_channels {channels}: served images are grey (1) or RGB (3)")
    mean = (
        processor.get("image_mean", [0.5] * channels)
        if processor.get("do_normalize", True)
        else [0.0] * channels
    )
    std = (
        processor.get("image_std", [0.5] * channels)
        if processor.get("do_normalize", True)
        else [1.0] * channels
    )
    numbers = (int, float)
    for key, values in (("image_mean", mean), ("image_std", std)):
        if not isinstance(values, list) or not all(
            isinstance(v, numbers) and not isinstance(v, bool) for v in values
        ):
            raise ImportRefused(f"preprocessor_config.json {key} is {values!r}: expected a list of numbers")
    if len(mean) != channels or len(std) != channels:
        raise ImportRefused(f"preprocessor_config.json image_mean/image_std have not {channels} values")
    factor = processor.get("rescale_factor", 1 / 255)
    if isinstance(factor, bool) or not isinstance(factor, numbers):
        raise ImportRefused(f"preprocessor_config.json rescale_factor is {factor!r}: expected a number")
    size = processor["size"]
    return {
        "color_mode": "RGB" if channels == 3 else "L",
        "image_size": [int(size["height"]), int(size["width"])],
        "resample": RESAMPLE[int(processor.get("resample", 2))],
        "scale": float(processor.get("rescale_factor", 1 / 255))
        if processor.get("do_rescale", True)
        else 1.0,
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "layout": "NCHW",
        "note": "the checkpoint's preprocessor_config.json",
    }


def manifest_fields(checkpoint: Checkpoint, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """Everything the manifest says of the model, but its graphs, files and checks."""
    task, family = checkpoint.task, checkpoint.family
    fields: dict[str, Any] = {
        "task": task,
        "architecture": checkpoint.architecture,
        "description": f"{checkpoint.architecture} imported from a Hugging Face checkpoint ({checkpoint.folder.name})",
        "config": {
            **checkpoint.config,
            "num_heads": checkpoint.num_heads,
            "hidden_size": checkpoint.hidden_size,
        },
    }
    if checkpoint.labels is not None:
        fields["labels"] = checkpoint.labels
    if task == "image-classification":
        fields["preprocessing"] = _preprocessing(checkpoint)
        return fields
    assert tokenizer is not None, "a text model without a tokenizer"
    window = _window(checkpoint)
    fields["max_sequence_length"] = window
    n, h, dh = checkpoint.num_layers, checkpoint.num_heads, checkpoint.head_dim
    if family in ("bert", "distilbert"):
        fields["special_tokens"] = _bert_tokens(checkpoint, tokenizer)
    if task == "question-answering":
        window = min(window, QA_MAX_WINDOW)
        fields["max_sequence_length"] = window
        fields["qa"] = {
            "stride": min(window // 2, QA_MAX_STRIDE),
            "max_question_length": min(QA_MAX_QUESTION, window // 4),
            "max_answer_length": QA_MAX_ANSWER,
            "span_score": "context_probabilities",
        }
    if task == "token-classification":
        fields["tagging"] = {
            "scheme": "BIO",
            "label_on": "every token (transformers' aggregation 'simple')",
            "aggregation": "simple",
        }
    if task == "feature-extraction":
        fields["embedding"] = {
            "dimensions": checkpoint.hidden_size,
            "pooling": "mean",
            "normalized_output": "sentence_embedding",
            "pooled_output": "mean_pooled",
        }
    if task == "rerank":
        declared = checkpoint.sentence_transformers.get("activation_fn")
        fields["ranking"] = {
            "score": ACTIVATIONS[declared] if declared else "sigmoid",  # what the service answers
            "pairs": "[CLS] query [SEP] document [SEP], the longer text cut first (longest_first)",
            "activation": declared
            or "none declared: sentence-transformers' CrossEncoder default for one label, the sigmoid",
        }
    if task == "text-generation":
        _refuse_generation(checkpoint)
        _suppressed(checkpoint)
        eos = _generation_id(checkpoint, "eos_token_id")
        if eos is None:
            raise ImportRefused(
                "no eos_token_id in generation_config.json or config.json: generation could not stop"
            )
        pad = _generation_id(checkpoint, "pad_token_id")
        fields["special_tokens"] = {"eos": eos, "pad": eos if pad is None else pad}
        fields["kv_cache"] = kv_cache_layout(n, h, dh)
    if task == "translation":
        _refuse_generation(checkpoint)
        eos, pad = _generation_id(checkpoint, "eos_token_id"), _generation_id(checkpoint, "pad_token_id")
        start = _generation_id(checkpoint, "decoder_start_token_id")
        if eos is None or pad is None:
            raise ImportRefused("config.json lacks eos_token_id or pad_token_id")
        start = pad if start is None else start
        fields["special_tokens"] = {"pad": pad, "eos": eos, "bos": start, "decoder_start": start}
        unk = tokenizer.token_to_id(_named(checkpoint, "unk_token", "<unk>"))
        if unk is not None:
            fields["special_tokens"]["unk"] = unk
        fields["suppress_tokens"] = _suppressed(checkpoint)
        fields["forced_eos"] = _generation_id(checkpoint, "forced_eos_token_id") == eos
        fields["source_suffix"] = [eos]  # MarianTokenizer ends every source with </s>
        fields["max_source_length"] = window
        fields["max_target_length"] = _position_table(checkpoint) - 1
        fields["source_language"] = checkpoint.tokenizer_config.get("source_lang")
        fields["target_language"] = checkpoint.tokenizer_config.get("target_lang")
        fields["kv_cache"] = kv_cache_layout(n, h, dh)
        fields["cross_attention"] = {
            "num_layers": n,
            "axes": ["batch", "num_heads", "source_sequence", "head_dim"],
            "key": "cross_key.{i}",
            "value": "cross_value.{i}",
            "mask_input": "encoder_attention_mask",
        }
    template = chat_template(checkpoint.folder, checkpoint.tokenizer_config)
    if template is not None:
        fields["chat_template"] = template
    return fields
