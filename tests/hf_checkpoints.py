"""Small random-weight Hugging Face checkpoints of every family the import takes, made on the spot.

Each is what a user would bring: ``transformers``' own config class and ``save_pretrained``, with a
tokenizer trained here on the shared data (WordPiece for the BERT family, byte-level BPE for GPT-2,
two SentencePiece models and a shared vocabulary for Marian, as opus-mt ships them) or ViT's image
processor. Nothing is downloaded. The weights are random but seeded, so every run builds the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from model_export.data import load_conll, load_multi30k, load_squad, load_sst2, load_tinyshakespeare
from model_export.importing.tokenizer import SAMPLE_TEXTS
from model_export.tokenization import train_byte_level_bpe, train_wordpiece

TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def _bert_texts(data_dir: Path) -> list[str]:
    texts = [t for t, _ in load_sst2(data_dir, "train")[:4000]]
    texts += [" ".join(s.tokens) for s in load_conll(data_dir, "train")[:2000]]
    texts += [e.context for e in load_squad(data_dir, "train")[:300]]
    texts += [e.question for e in load_squad(data_dir, "train")[:1000]]
    return texts


def _save_bert_tokenizer(folder: Path, data_dir: Path, family: str, cased: bool = False) -> None:
    from transformers import BertTokenizer, DistilBertTokenizer

    tokenizer = train_wordpiece(_bert_texts(data_dir), 800, lowercase=not cased)
    kind = DistilBertTokenizer if family == "distilbert" else BertTokenizer
    fast = kind(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    fast.save_pretrained(folder)


def bert(folder: Path, data_dir: Path, task: str, family: str = "bert", seed: int = 0) -> Path:
    """A 2-layer, 32-wide BERT (or DistilBERT) with the head of ``task``, and its WordPiece tokenizer."""
    import torch
    from transformers import (
        AutoModel,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        BertConfig,
        DistilBertConfig,
    )

    torch.manual_seed(seed)
    labels = {"text-classification": ["negative", "positive"], "token-classification": TAGS}.get(task)
    extra = (
        {"id2label": dict(enumerate(labels)), "label2id": {v: k for k, v in enumerate(labels)}}
        if labels
        else {}
    )
    if family == "distilbert":
        config = DistilBertConfig(
            vocab_size=800, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, **extra
        )
    else:
        config = BertConfig(
            vocab_size=800,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **extra,
        )
    classes = {
        "text-classification": AutoModelForSequenceClassification,
        "token-classification": AutoModelForTokenClassification,
        "question-answering": AutoModelForQuestionAnswering,
        "feature-extraction": AutoModel,
    }
    model = classes[task].from_config(config)
    model.eval().save_pretrained(folder)
    _save_bert_tokenizer(folder, data_dir, family)
    if task == "feature-extraction":  # a sentence-transformers folder: mean pooling, then L2 normalisation
        (folder / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {
                        "idx": 1,
                        "name": "1",
                        "path": "1_Pooling",
                        "type": "sentence_transformers.models.Pooling",
                    },
                    {
                        "idx": 2,
                        "name": "2",
                        "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize",
                    },
                ]
            )
        )
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": 48, "do_lower_case": False})
        )
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
        )
        (folder / "2_Normalize").mkdir(exist_ok=True)
    return folder


def gpt2(folder: Path, data_dir: Path, seed: int = 0) -> Path:
    """A 2-layer, 32-wide GPT-2 and its byte-level BPE trained on Tiny Shakespeare."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    text = load_tinyshakespeare(data_dir, "train")[:200_000]
    tokenizer = train_byte_level_bpe(text.splitlines(keepends=True), 600, ["<|endoftext|>"])
    eos = tokenizer.token_to_id("<|endoftext|>")
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>", model_max_length=64
    ).save_pretrained(folder)
    return folder


def marian(folder: Path, data_dir: Path, seed: int = 0) -> Path:
    """A 2+2-layer, 32-wide Marian EN->DE with opus-mt's files: source.spm, target.spm, one vocab.json.

    Only the slow (SentencePiece) tokenizer, as opus-mt ships it: the import converts it.
    """
    import io

    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = load_multi30k(data_dir, "train")[:6000]
    pieces: list[str] = []
    for side, name in ((0, "source.spm"), (1, "target.spm")):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            # every character of the texts the import checks its conversion on, as a real opus-mt covers them
            sentence_iterator=iter([p[side] for p in pairs] + (list(SAMPLE_TEXTS) if side == 0 else [])),
            model_writer=model,
            vocab_size=300,
            model_type="unigram",
            unk_id=1,
            eos_id=0,
            bos_id=-1,
            pad_id=-1,
            unk_piece="<unk>",
            eos_piece="</s>",
            minloglevel=2,
        )
        (folder / name).write_bytes(model.getvalue())
        processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
        pieces += [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab: dict[str, int] = {}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = MarianTokenizer(
        str(folder / "source.spm"),
        str(folder / "target.spm"),
        str(folder / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    tokenizer.save_pretrained(folder)
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=pad,
        activation_function="swish",  # opus-mt's
        scale_embedding=True,
    )
    model = MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[pad]]  # opus-mt never generates <pad>
    model.generation_config.max_length = 64
    model.save_pretrained(folder)
    return folder


def vit(folder: Path, seed: int = 0) -> Path:
    """A 2-layer, 32-wide ViT over 32x32 RGB images in 8x8 patches, with ViT's image processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(seed)
    labels = ["cat", "dog", "bird"]
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        id2label=dict(enumerate(labels)),
        label2id={v: k for k, v in enumerate(labels)},
    )
    ViTForImageClassification(config).eval().save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder
