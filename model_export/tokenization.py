"""Tokenizers trained (or loaded) with the Hugging Face ``tokenizers`` library.

The resulting ``tokenizers.Tokenizer`` is saved as ``tokenizer.json`` next to each ONNX
model, so the service (which has no torch and no ``transformers``) tokenizes exactly as
training did. Offsets in every encoding are character offsets into the original input,
which the service uses to return entity and answer spans.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "special_token_ids",
    "train_byte_level_bpe",
    "train_wordpiece",
    "wordpiece_from_vocab",
]

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDPIECE_PREFIX = "##"


def special_token_ids(tokenizer: Tokenizer, names: list[str]) -> dict[str, int]:
    """Map each special token name to its id; ValueError names any token not in the vocab."""
    ids: dict[str, int] = {}
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is None:
            raise ValueError(f"special token {name!r} is not in the tokenizer vocabulary")
        ids[name] = token_id
    return ids


def train_byte_level_bpe(
    texts: Iterable[str], vocab_size: int, special_tokens: list[str], min_frequency: int = 2
) -> Tokenizer:
    """Train a GPT-2 style byte-level BPE tokenizer.

    The full 256-byte initial alphabet means any text encodes without unknowns, and
    with ``add_prefix_space=False`` decoding reproduces the input exactly (spaces,
    newlines, emoji included). Special tokens get ids ``0..len-1`` in the given order.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps offsets covering the leading space a token carries.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _bert_pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    """Wrap a WordPiece model in BERT's normalizer, pre-tokenizer and decoder."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=_WORDPIECE_PREFIX)
    return tokenizer


def _add_bert_template(tokenizer: Tokenizer) -> Tokenizer:
    """Add ``[CLS] A [SEP] (B [SEP])`` with the vocab's real [CLS]/[SEP] ids and type ids 0/1."""
    ids = special_token_ids(tokenizer, BERT_SPECIAL_TOKENS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return tokenizer


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer; specials get ids 0..4 in BERT_SPECIAL_TOKENS order."""
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BERT_SPECIAL_TOKENS),
        continuing_subword_prefix=_WORDPIECE_PREFIX,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return _add_bert_template(tokenizer)


def wordpiece_from_vocab(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """Build the BERT pipeline from a checkpoint's ``vocab.txt`` (one token per line, id = line number).

    Used for pretrained checkpoints, whose special ids are wherever the vocab puts them
    (e.g. [PAD]=0, [UNK]=100, [CLS]=101 in bert-base-uncased), so they are looked up.
    """
    path = Path(vocab_file)
    if not path.is_file():
        raise FileNotFoundError(f"vocab file {path.resolve()} does not exist")
    vocab: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for index, line in enumerate(f):
            vocab[line.rstrip("\r\n")] = index  # later duplicates win, as in transformers
    model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix=_WORDPIECE_PREFIX)
    return _add_bert_template(_bert_pipeline(model, lowercase))
