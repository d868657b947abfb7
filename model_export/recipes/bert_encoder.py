"""The BERT encoder the four BERT models share, prepared once per build.

It starts from a Hugging Face BERT checkpoint when one is given (`--init-from`, or the
all-MiniLM-L6-v2 checkpoint the setup fetches), or else is pretrained here with masked-LM on the
text at hand (SST-2, SQuAD and CoNLL training text), as the lecture describes. Each head copies it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from ..data import load_conll, load_squad, load_sst2
from ..hf_checkpoint import DEFAULT_CHECKPOINT_DIR, load_hf_bert
from ..models.bert import BertEncoder, BertForMaskedLM
from ..profiles import BertEmbedderRecipe, BertHeadRecipe
from ..tokenization import special_token_ids, train_wordpiece, wordpiece_from_vocab
from ..training import save_curve, train
from .common import BuildContext

log = logging.getLogger(__name__)

IGNORE = -100  # the label of a position no loss is computed on

# Any recipe that names the encoder's masked-LM fallback: the heads' and the embedder's.
BertRecipe = TypeVar("BertRecipe", bound=BertHeadRecipe | BertEmbedderRecipe)


@dataclass
class PreparedEncoder:
    encoder: BertEncoder
    tokenizer: Tokenizer
    pooler: dict[str, torch.Tensor] | None
    origin: dict[str, Any]
    pretraining_losses: list[float] | None = None

    @property
    def pad_id(self) -> int:
        return special_token_ids(self.tokenizer, ["[PAD]"])["[PAD]"]

    def save_pretraining_curve(self, work_dir: Path) -> None:
        """The masked-LM loss curve beside the head's own (none when the encoder came from a checkpoint)."""
        if self.pretraining_losses:
            save_curve(
                self.pretraining_losses, work_dir / "pretraining_curve.png", "bert masked-LM pretraining"
            )


_prepared: dict[tuple[str, str, str], PreparedEncoder] = {}


def prepare_encoder(ctx: BuildContext[BertRecipe]) -> PreparedEncoder:
    """Load the checkpoint or pretrain with masked-LM, once per (profile, source, data) in this process."""
    init_from = ctx.init_from
    if init_from is None and ctx.profile == "default" and (DEFAULT_CHECKPOINT_DIR / "config.json").is_file():
        init_from = DEFAULT_CHECKPOINT_DIR
    key = (ctx.profile, str(init_from), str(ctx.data_dir))
    if key not in _prepared:
        if init_from is not None:
            hf = load_hf_bert(init_from)
            log.info("BERT encoder initialised from the checkpoint in %s", init_from)
            _prepared[key] = PreparedEncoder(
                hf.encoder,
                wordpiece_from_vocab(hf.vocab_file, lowercase=hf.lowercase),
                hf.pooler,
                {"init_from": str(init_from), "checkpoint_config": dataclasses.asdict(hf.config)},
            )
        else:
            if ctx.profile == "default":
                log.warning(
                    "no BERT checkpoint found (run scripts/fetch_checkpoint.py or pass --init-from): "
                    "falling back to masked-LM pretraining from scratch, expect lower QA/NER scores"
                )
            _prepared[key] = pretrain_mlm(ctx)
    return _prepared[key]


def pretraining_texts(ctx: BuildContext[BertRecipe]) -> list[str]:
    texts = [s for s, _ in load_sst2(ctx.data_dir, "train")]
    squad = load_squad(ctx.data_dir, "train")
    texts += sorted({ex.context for ex in squad}) + [ex.question for ex in squad]
    texts += [" ".join(s.tokens) for s in load_conll(ctx.data_dir, "train")]
    random.Random(ctx.seed).shuffle(texts)
    return texts


def pretrain_mlm(ctx: BuildContext[BertRecipe]) -> PreparedEncoder:
    """Masked-LM pretraining: 15% of tokens chosen, of those 80% [MASK], 10% random, 10% kept."""
    recipe = ctx.recipe.pretraining
    texts = pretraining_texts(ctx)
    tokenizer = train_wordpiece(texts, recipe.model.vocab_size)
    config = dataclasses.replace(recipe.model, vocab_size=tokenizer.get_vocab_size())
    mlm = BertForMaskedLM(BertEncoder(config))
    cls_id, sep_id, mask_id = special_token_ids(tokenizer, ["[CLS]", "[SEP]", "[MASK]"]).values()
    stream = [
        t for enc in tokenizer.encode_batch(texts, add_special_tokens=False) for t in [*enc.ids, sep_id]
    ]
    body = recipe.seq_len - 1
    chunks = torch.tensor(stream[: len(stream) // body * body]).view(-1, body)
    chunks = torch.cat([torch.full((len(chunks), 1), cls_id), chunks], dim=1)  # (N, L)
    gen = torch.Generator().manual_seed(ctx.seed)

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            ids = chunks[torch.randint(0, len(chunks), (recipe.batch_size,), generator=gen)].clone()
            chosen = (torch.rand(ids.shape, generator=gen) < 0.15) & (ids != cls_id) & (ids != sep_id)
            labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
            roll = torch.rand(ids.shape, generator=gen)
            ids[chosen & (roll < 0.8)] = mask_id
            random_ids = torch.randint(5, config.vocab_size, ids.shape, generator=gen)
            swap = chosen & (roll >= 0.8) & (roll < 0.9)
            ids[swap] = random_ids[swap]
            yield ids, labels

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        ids, labels = batch
        logits = m(ids, torch.ones_like(ids), torch.zeros_like(ids))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE)
        return loss, len(ids), ids.numel()

    spec = dataclasses.replace(recipe.train, device=ctx.device)
    result = train(mlm, batches(), loss_fn, spec, "bert-mlm-pretraining")
    origin = {
        "init_from": None,
        "pretraining": {"objective": "masked-LM", "texts": len(texts), **result.summary()},
    }
    return PreparedEncoder(mlm.encoder, tokenizer, None, origin, result.losses)
