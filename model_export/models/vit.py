"""Vision Transformer (Dosovitskiy et al. 2020): patch embedding, a [CLS] token, learned positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .layers import EncoderLayer, init_weights


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 28
    patch_size: int = 4
    channels: int = 1
    num_classes: int = 10
    d_model: int = 128
    num_layers: int = 6
    num_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1


class PatchEmbedding(nn.Module):
    """Cut the image into non-overlapping P x P patches and project each to D (a strided convolution)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        assert config.image_size % config.patch_size == 0, (
            f"image size {config.image_size} is not a multiple of patch size {config.patch_size}"
        )
        self.num_patches = (config.image_size // config.patch_size) ** 2
        self.proj = nn.Conv2d(config.channels, config.d_model, config.patch_size, stride=config.patch_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.proj(pixel_values).flatten(2).transpose(1, 2)  # (B, N, D)


class ViT(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbedding(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.d_model))
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, config.d_model) * 0.02)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(config.d_model, config.num_heads, config.d_ff, config.dropout, norm_first=True)
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self.apply(init_weights)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values (B, C, H, W), normalised as in training -> logits (B, num_classes)."""
        x = self.patch_embed(pixel_values)  # (B, N, D)
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, D)
        x = self.drop(torch.cat([cls, x], dim=1) + self.pos_embed)  # (B, N + 1, D)
        for layer in self.layers:
            x = layer(x, None)
        return self.head(self.norm(x[:, 0]))  # (B, num_classes)
