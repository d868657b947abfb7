"""The served ``tokenizer.json``: the checkpoint's own, or its slow tokenizer converted once and checked on text.

- A checkpoint with ``tokenizer.json`` serves that file (special tokens, normalisation, post-processor
  as the user trained them).
- Marian (opus-mt) ships SentencePiece models (``source.spm``, ``target.spm``) and one ``vocab.json``:
  the source model becomes a ``tokenizers`` Unigram whose ids are ``vocab.json``'s, with SentencePiece's
  own normaliser (``transformers``' ``SpmConverter.build_tokenizer_from_spm_proto``); pieces of the
  shared vocabulary that the source model lacks can never be chosen. No post-processor: the service
  appends the manifest's ``source_suffix`` (</s>) itself. The conversion is checked on text against
  ``MarianTokenizer`` (ids of every source sentence, and decoding of ids back to text).
- Any other checkpoint without ``tokenizer.json`` (a BERT ``vocab.txt``) is converted by
  ``transformers``' ``AutoTokenizer`` and checked the same way against the slow tokenizer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders

from .checkpoint import Checkpoint, ImportRefused

log = logging.getLogger(__name__)

_ALL = 1 << 20  # strip every leading and trailing space

# Text the conversion is checked on when the user gives none: punctuation, digits, accents, spacing.
SAMPLE_TEXTS = [
    "A man is riding a bicycle down the street.",
    "Two dogs play in the snow, and a child watches them!",
    "The café on 5th Avenue opens at 7:30 a.m. — über-früh?",
    "  Leading and trailing spaces,   and  doubled ones. ",
    "Numbers 12345 and symbols #@$% (in brackets) [and more].",
]


def _unigram_tokenizer(proto: Any, vocab: dict[str, int]) -> Tokenizer:
    """The SentencePiece source model as a ``tokenizers`` Unigram over ``vocab.json``'s ids."""
    from transformers.convert_slow_tokenizer import SpmConverter

    scores = {p.piece: p.score for p in proto.pieces}
    # SentencePiece emits a character it lacks as an unknown piece, which MarianTokenizer then looks up
    # in the shared vocabulary: a one-character piece of the target side scores as SentencePiece's
    # unknown does (its lowest score less 10); a longer one the source model lacks is never chosen.
    unknown = min(scores.values()) - 10.0
    floor = min(scores.values()) - 1e6
    table = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in table] != list(range(len(table))):
        raise ImportRefused("vocab.json ids are not 0..N-1 without gaps")
    unk_piece = proto.trainer_spec.unk_piece
    if unk_piece not in vocab:
        raise ImportRefused(f"vocab.json lacks the SentencePiece unknown piece {unk_piece!r}")
    pieces = [(piece, scores.get(piece, unknown if len(piece) == 1 else floor)) for piece, _ in table]
    proto.trainer_spec.unk_id = vocab[unk_piece]
    tokenizer = SpmConverter.build_tokenizer_from_spm_proto(proto, pieces)
    if tokenizer is None:
        raise ImportRefused("source.spm could not be converted to a tokenizers Unigram")
    # MarianTokenizer's decoding: pieces joined, "▁" as spaces, the text stripped at both ends
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", _ALL, _ALL)]
    )
    return tokenizer


def _marian(checkpoint: Checkpoint) -> Tokenizer:
    from transformers.utils import sentencepiece_model_pb2_new as model_pb2  # type: ignore[attr-defined]

    folder = checkpoint.folder
    missing = [f for f in ("source.spm", "target.spm", "vocab.json") if not (folder / f).is_file()]
    if missing:
        raise ImportRefused(f"no tokenizer.json and no Marian tokenizer files {missing} to convert")
    if checkpoint.tokenizer_config.get("separate_vocabs"):
        raise ImportRefused(
            "tokenizer_config.json separate_vocabs is true: the service decodes with one vocabulary"
        )
    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString((folder / "source.spm").read_bytes())
    if proto.trainer_spec.model_type != 1:
        raise ImportRefused("source.spm is not a Unigram SentencePiece model")
    if proto.trainer_spec.byte_fallback:
        raise ImportRefused("source.spm uses byte fallback, which the converted tokenizer cannot reproduce")
    vocab = json.loads((folder / "vocab.json").read_text())
    tokenizer = _unigram_tokenizer(proto, vocab)
    for token in ("</s>", "<unk>", "<pad>"):
        if token in vocab:
            tokenizer.add_special_tokens([token])
    return tokenizer


def _check_marian(tokenizer: Tokenizer, checkpoint: Checkpoint, texts: Sequence[str]) -> dict[str, Any]:
    """The converted tokenizer against ``MarianTokenizer``: source ids, and target ids decoded to text."""
    from transformers import MarianTokenizer

    slow = MarianTokenizer.from_pretrained(str(checkpoint.folder))
    eos = slow.eos_token_id
    checked, mismatches = 0, []
    for text in texts:
        expected = slow(text).input_ids  # ids + </s>
        got = [*tokenizer.encode(text).ids, eos]
        checked += 1
        if got != expected:
            mismatches.append({"text": text, "slow": expected, "converted": got})
            continue
        decoded = slow.decode(expected, skip_special_tokens=True)  # as a translation: target.spm's pieces
        if tokenizer.decode(got, skip_special_tokens=True) != decoded:
            mismatches.append(
                {"text": text, "slow_decoded": decoded, "converted_decoded": tokenizer.decode(got)}
            )
    if mismatches:
        raise ImportRefused(
            f"the converted tokenizer differs from MarianTokenizer on {len(mismatches)} of {checked} texts; "
            f"first: {mismatches[0]}"
        )
    return {
        "converted_from": "source.spm + vocab.json (SentencePiece Unigram)",
        "checked_texts": checked,
        "equal": True,
    }


# family -> the slow tokenizer's files, converted when tokenizer.json is absent
SLOW_FILES = {
    "bert": ("vocab.txt",),
    "distilbert": ("vocab.txt",),
    "gpt2": ("vocab.json", "merges.txt"),
}


def _auto_converted(checkpoint: Checkpoint, texts: Sequence[str]) -> tuple[Tokenizer, dict[str, Any]]:
    """A non-Marian checkpoint without tokenizer.json: ``AutoTokenizer``'s fast conversion, checked on text."""
    from transformers import AutoTokenizer

    needed = SLOW_FILES.get(checkpoint.family, ())
    missing = [f for f in needed if not (checkpoint.folder / f).is_file()]
    if missing or not needed:
        raise ImportRefused(
            f"no tokenizer: the folder has no tokenizer.json and no {' + '.join(needed) or 'slow tokenizer'} to convert"
        )

    try:
        fast = AutoTokenizer.from_pretrained(str(checkpoint.folder))
    except Exception as exc:
        raise ImportRefused(f"no tokenizer.json, and no slow tokenizer transformers can read: {exc}") from exc
    backend = getattr(fast, "backend_tokenizer", None) or getattr(fast, "_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ImportRefused("no tokenizer.json, and the checkpoint's tokenizer has no tokenizers form")
    tokenizer = Tokenizer.from_str(backend.to_str())
    for text in texts:
        if tokenizer.encode(text).ids != fast(text).input_ids:
            raise ImportRefused(f"the converted tokenizer differs from the checkpoint's on {text!r}")
    return tokenizer, {"converted_from": type(fast).__name__, "checked_texts": len(texts), "equal": True}


def read_tokenizer_json(path: Path) -> Tokenizer:
    """The checkpoint's ``tokenizer.json`` as ``tokenizers`` reads it; a file it cannot read is refused,
    with the reader's reason (which names the field it stopped at)."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ImportRefused(f"{path.name} is not a tokenizer tokenizers can read: {reason}") from exc


def served_tokenizer(
    checkpoint: Checkpoint, texts: Sequence[str] = SAMPLE_TEXTS
) -> tuple[Tokenizer | None, dict[str, Any]]:
    """The tokenizer the service will use, and the manifest's record of where it came from."""
    if checkpoint.task == "image-classification":
        return None, {}
    path = checkpoint.folder / "tokenizer.json"
    if path.is_file():
        tokenizer = read_tokenizer_json(path)
        record: dict[str, Any] = {"file": "tokenizer.json (the checkpoint's own)"}
        # The service pads a batch itself and cuts each text to the manifest's window, keeping the last
        # special token: the file's own fixed padding and truncation (sentence-transformers' 128) go.
        if tokenizer.padding is not None or tokenizer.truncation is not None:
            record["removed"] = {"padding": tokenizer.padding, "truncation": tokenizer.truncation}
            tokenizer.no_padding()
            tokenizer.no_truncation()
        return tokenizer, record
    if checkpoint.family == "marian":
        tokenizer = _marian(checkpoint)
        return tokenizer, _check_marian(tokenizer, checkpoint, texts)
    return _auto_converted(checkpoint, texts)


def token_id(tokenizer: Tokenizer, token: str | None, what: str) -> int:
    """The id of a special token the checkpoint names; ImportRefused when the vocabulary lacks it."""
    found = tokenizer.token_to_id(token) if token else None
    if found is None:
        raise ImportRefused(f"the tokenizer has no {what} token ({token!r})")
    return int(found)


def chat_template(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The checkpoint's chat template: ``chat_template.jinja`` or ``tokenizer_config.json``'s, kept as text."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: keep the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None
