"""BERT (Devlin et al. 2018): a post-LN Transformer encoder over WordPiece tokens, and its heads.

Embeddings are token + learned position + segment (token type), summed and
normalised. The same encoder carries a masked-LM head for pretraining and the
fine-tuning heads: [CLS] classification, QA start/end span, per-token tags, and
Sentence-BERT's mean pooling for sentence embeddings.
Module names mirror the Hugging Face checkpoint's where the structure allows,
so `hf_checkpoint` maps weights by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import EncoderLayer, LearnedPositionalEmbedding, padding_mask


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_position: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    pad_id: int = 0


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_id)
        self.position_embeddings = LearnedPositionalEmbedding(config.max_position, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        b, s = input_ids.shape
        positions = torch.arange(s, device=input_ids.device).expand(b, s)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.drop(self.norm(x))  # (B, S, D)


class BertEncoder(nn.Module):
    """Embeddings then post-LN encoder layers: the part every head shares."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(
            EncoderLayer(
                config.hidden_size,
                config.num_heads,
                config.intermediate_size,
                config.dropout,
                norm_first=False,
                activation="gelu",
                eps=config.layer_norm_eps,
            )
            for _ in range(config.num_layers)
        )
        self.apply(_init_bert_weights)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, attention_mask, token_type_ids (B, S) -> hidden states (B, S, D)."""
        x = self.embeddings(input_ids, token_type_ids)
        mask = padding_mask(attention_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)
        return x


class BertForMaskedLM(nn.Module):
    """Pretraining head: transform, then predict the vocabulary, tied to the word embeddings."""

    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__()
        d = encoder.config.hidden_size
        self.encoder = encoder
        self.transform = nn.Linear(d, d)
        self.transform_norm = nn.LayerNorm(d, eps=encoder.config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(encoder.config.vocab_size))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        h = self.transform_norm(F.gelu(self.transform(h)))
        return h @ self.encoder.embeddings.word_embeddings.weight.T + self.bias  # (B, S, V)


class BertForSequenceClassification(nn.Module):
    """The [CLS] head: pooler (dense + tanh on the first token), dropout, linear classifier."""

    def __init__(self, encoder: BertEncoder, num_labels: int) -> None:
        super().__init__()
        d = encoder.config.hidden_size
        self.encoder = encoder
        self.pooler = nn.Linear(d, d)
        self.drop = nn.Dropout(encoder.config.dropout)
        self.classifier = nn.Linear(d, num_labels)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        pooled = torch.tanh(self.pooler(h[:, 0]))  # (B, D)
        return self.classifier(self.drop(pooled))  # (B, num_labels)


class BertForPairRanking(nn.Module):
    """A cross-encoder: the pair read together, one relevance logit from three heads over it.

    - **Similarity**: the cosine of the segments' mean-pooled states (the query's, segment 0; the
      document's, segment 1), scaled.
    - **Exact match**: each query token that occurs in the document, weighted by a learned per-token
      importance (``term_weight``, initialised by the recipe with the tokens' IDF) and saturated in its
      count as BM25 saturates it (``tf / (tf + 1.2)``), averaged over the query's weights, scaled.
    - **[CLS]**: pooler, dropout, one linear output; it starts at zero.

    So an encoder that was trained as a sentence embedder (all-MiniLM-L6-v2, mean-pooled) ranks from the
    first step by its own similarity and the words the pair shares, and training adds what reading the
    pair together tells it.
    """

    SATURATION = 1.2  # BM25's k1

    def __init__(
        self, encoder: BertEncoder, scale: float = 20.0, match_scale: float = 25.0, shift: float = 0.0
    ) -> None:
        super().__init__()
        d = encoder.config.hidden_size
        self.encoder = encoder
        self.pooler = nn.Linear(d, d)
        self.drop = nn.Dropout(encoder.config.dropout)
        self.classifier = nn.Linear(d, 1)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)
        self.term_weight = nn.Embedding(encoder.config.vocab_size, 1)
        nn.init.ones_(self.term_weight.weight)
        self.scale = nn.Parameter(torch.tensor(scale))
        self.match_scale = nn.Parameter(torch.tensor(match_scale))
        self.shift = nn.Parameter(torch.tensor(shift))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        real = attention_mask.to(h.dtype)
        second = token_type_ids.to(h.dtype) * real
        first = real - second

        def mean(weights: torch.Tensor) -> torch.Tensor:
            pooled = (h * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp(min=1.0)
            return pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-6)

        cosine = (mean(first) * mean(second)).sum(-1, keepdim=True)  # (B, 1)
        same = (input_ids.unsqueeze(2) == input_ids.unsqueeze(1)).to(h.dtype)  # (B, S, S)
        counts = (same * second.unsqueeze(1)).sum(2)  # each token's occurrences in the document (B, S)
        weights = self.term_weight(input_ids).squeeze(-1) * first  # the query's tokens only
        matched = (weights * counts / (counts + self.SATURATION)).sum(1, keepdim=True)
        match = matched / weights.sum(1, keepdim=True).clamp(min=1e-6)  # (B, 1), 0 to 1
        pooled = torch.tanh(self.pooler(h[:, 0]))
        head = self.classifier(self.drop(pooled))
        return self.scale * cosine + self.match_scale * match + self.shift + head  # (B, 1)


class BertForQuestionAnswering(nn.Module):
    """Span head over (question, context): a start and an end score per token."""

    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.qa_outputs = nn.Linear(encoder.config.hidden_size, 2)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        start_logits, end_logits = self.qa_outputs(h).unbind(-1)  # each (B, S)
        return start_logits, end_logits


class BertForTokenClassification(nn.Module):
    """Per-token BIO tag head."""

    def __init__(self, encoder: BertEncoder, num_labels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.drop = nn.Dropout(encoder.config.dropout)
        self.classifier = nn.Linear(encoder.config.hidden_size, num_labels)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.drop(h))  # (B, S, num_labels)


class BertForSentenceEmbedding(nn.Module):
    """Sentence embeddings as Sentence-BERT makes them: the mean of the encoder's states over real tokens.

    Returns the L2-normalised mean (what all-MiniLM-L6-v2 was trained to compare by
    cosine) and the raw mean (for callers who normalise, or not, themselves).
    """

    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(input_ids, attention_mask, token_type_ids)  # (B, S, D)
        real = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, S, 1): padding counts for nothing
        pooled = (h * real).sum(1) / real.sum(1).clamp(min=1e-9)  # (B, D)
        return F.normalize(pooled, p=2.0, dim=-1), pooled  # each (B, D)


def _init_bert_weights(module: nn.Module) -> None:
    """BERT's own initialisation: N(0, 0.02) for every matrix, as in Devlin et al. and Hugging Face.

    Not `layers.init_weights` (Xavier): masked-LM pretraining from scratch starts here, and a
    checkpoint (`--init-from`, the default build) overwrites every encoder weight anyway.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
