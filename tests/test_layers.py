"""Attention masks in every architecture: the future never leaks backwards, padding never leaks into real tokens."""

from __future__ import annotations

import pytest
import torch
from parity import check_close

from model_export.models.bert import BertConfig, BertEncoder
from model_export.models.gpt import GPT, GPTConfig
from model_export.models.layers import (
    causal_mask,
    decoder_self_mask,
    positions_from_mask,
    scaled_dot_product_attention,
)
from model_export.models.translator import EncoderDecoder, TranslatorConfig
from model_export.models.vit import ViT, ViTConfig

torch.manual_seed(0)
ATOL = 1e-5
RTOL = 1e-5  # torch.allclose's default, which these parity checks used


@pytest.fixture(scope="module")
def gpt() -> GPT:
    return GPT(GPTConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=32)).eval()


@pytest.fixture(scope="module")
def translator() -> EncoderDecoder:
    return EncoderDecoder(
        TranslatorConfig(
            vocab_size=50, d_model=32, num_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, max_len=32
        )
    ).eval()


@pytest.fixture(scope="module")
def bert() -> BertEncoder:
    return BertEncoder(
        BertConfig(
            vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=32
        )
    ).eval()


def test_causal_mask_shape_and_offset() -> None:
    mask = causal_mask(2, 5, torch.device("cpu"))[0, 0]  # two new queries after three cached keys
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_fully_masked_row_stays_finite() -> None:
    q = k = v = torch.randn(1, 1, 3, 4)
    mask = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    assert torch.isfinite(scaled_dot_product_attention(q, k, v, mask)).all()


@torch.no_grad()
def test_gpt_future_tokens_do_not_change_earlier_positions(gpt: GPT) -> None:
    ids = torch.randint(0, 50, (1, 10))
    changed = ids.clone()
    changed[0, 6:] = (changed[0, 6:] + 7) % 50
    a, _ = gpt(ids)
    b, _ = gpt(changed)
    check_close(a[0, :6], b[0, :6], atol=ATOL, rtol=RTOL, name_a="original", name_b="future changed")
    assert not torch.allclose(a[0, 6:], b[0, 6:], atol=ATOL)


@torch.no_grad()
def test_gpt_left_padding_does_not_change_real_tokens(gpt: GPT) -> None:
    ids = torch.randint(0, 50, (1, 6))
    padded = torch.cat([torch.full((1, 3), 7), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    alone, _ = gpt(ids)
    batched, _ = gpt(padded, mask, positions_from_mask(mask))
    check_close(alone[0], batched[0, 3:], atol=ATOL, rtol=RTOL, name_a="alone", name_b="left-padded")


@torch.no_grad()
def test_translator_decoder_is_causal_and_ignores_source_padding(translator: EncoderDecoder) -> None:
    src = torch.randint(3, 50, (1, 7))
    tgt = torch.randint(3, 50, (1, 8))
    base = translator(src, torch.ones_like(src), tgt)
    changed = tgt.clone()
    changed[0, 5:] = (changed[0, 5:] + 11) % 50
    later_changed = translator(src, torch.ones_like(src), changed)
    check_close(
        base[0, :5], later_changed[0, :5], atol=ATOL, rtol=RTOL, name_a="original", name_b="future changed"
    )
    padded_src = torch.cat([src, torch.full((1, 4), 0)], dim=1)
    padded_mask = torch.cat([torch.ones_like(src), torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded = translator(padded_src, padded_mask, tgt)
    check_close(base, padded, atol=ATOL, rtol=RTOL, name_a="unpadded source", name_b="padded source")


@torch.no_grad()
def test_bert_padding_does_not_change_real_tokens(bert: BertEncoder) -> None:
    ids = torch.randint(5, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 4])
    alone = bert(ids, torch.ones_like(ids), torch.zeros_like(ids))
    batched = bert(padded, mask, torch.zeros_like(padded))
    check_close(alone[0], batched[0, :6], atol=ATOL, rtol=RTOL, name_a="alone", name_b="right-padded")


@torch.no_grad()
def test_bert_is_bidirectional(bert: BertEncoder) -> None:
    ids = torch.randint(5, 50, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 50
    a = bert(ids, torch.ones_like(ids), torch.zeros_like(ids))
    b = bert(changed, torch.ones_like(ids), torch.zeros_like(ids))
    assert not torch.allclose(a[0, 0], b[0, 0], atol=ATOL)  # encoders see the whole sentence


@torch.no_grad()
def test_gpt_cache_matches_full_pass_with_padding(gpt: GPT) -> None:
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    full, _ = gpt(ids, mask, positions_from_mask(mask))
    _, past = gpt(ids[:, :5], mask[:, :5], positions_from_mask(mask)[:, :5])
    step, _ = gpt(ids[:, 5:], mask, positions_from_mask(mask)[:, 5:], past)
    check_close(full[:, 5:], step, atol=ATOL, rtol=RTOL, name_a="full pass", name_b="cached step")


def test_decoder_self_mask_combines_padding_and_causality() -> None:
    mask = decoder_self_mask(torch.tensor([[0, 1, 1]]), 2)[0, 0]
    assert mask.tolist() == [[False, True, False], [False, True, True]]


@torch.no_grad()
def test_vit_output_per_image_is_independent_of_the_batch() -> None:
    vit = ViT(ViTConfig(d_model=32, num_layers=2, num_heads=4, d_ff=64)).eval()
    x = torch.randn(3, 1, 28, 28)
    check_close(vit(x)[1], vit(x[1:2])[0], atol=ATOL, rtol=RTOL, name_a="in a batch of 3", name_b="alone")


@torch.no_grad()
def test_translator_teacher_forcing_matches_the_exported_decode_path(translator: EncoderDecoder) -> None:
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 5))
    src_mask = torch.ones_like(src)
    memory = translator.encode(src, src_mask)
    positions = torch.arange(5).expand(2, 5)
    decoded, _ = translator.decode(
        tgt, torch.ones_like(tgt), positions, src_mask, translator.cross_kv(memory)
    )
    teacher_forced = translator(src, src_mask, tgt)
    check_close(teacher_forced, decoded, atol=ATOL, rtol=RTOL, name_a="teacher forcing", name_b="decode path")
