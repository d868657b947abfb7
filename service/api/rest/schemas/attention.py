"""``return_attention``: the request fields every task with attention maps shares, and the map's shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from service.inference import AttentionMap, AttentionQuery

_BATCH_FIELDS = ("texts", "images", "items")  # a request's batch inputs: return_attention takes one input


class AttentionFields(BaseModel):
    """Mixed into the translate, classify and extract requests."""

    return_attention: bool = Field(
        default=False,
        description="Also return the input's attention map from one layer (`attention` in the result): "
        "one input only (text, image, or question + context fitting one window), at most "
        "ATTENTION_MAX_TOKENS tokens; computed by the model's attention graph after the normal answer, "
        "never cached",
    )
    attention_layer: int | None = Field(
        default=None,
        description="With return_attention: the layer, 0-based; negative counts from the last (-1); "
        "default the last. Out of the model's range: 422",
    )
    attention_head: int | None = Field(
        default=None,
        ge=0,
        description="With return_attention: the head, 0-based; default (null) the mean over heads",
    )

    @model_validator(mode="after")
    def _attention_fits(self) -> Any:
        if not self.return_attention:
            for name in ("attention_layer", "attention_head"):
                if getattr(self, name) is not None:
                    raise PydanticCustomError(
                        "needs_return_attention",
                        "{name} needs return_attention: true",
                        {"name": name, "field": name},
                    )
            return self
        batch = [name for name in _BATCH_FIELDS if getattr(self, name, None) is not None]
        if batch:
            raise PydanticCustomError(
                "one_input",
                "return_attention takes one input, not a batch ({name}): give text, image, or "
                "question + context",
                {"name": batch[0], "field": "return_attention"},
            )
        return self

    def attention_query(self) -> AttentionQuery | None:
        """What the core needs, or None without return_attention."""
        if not self.return_attention:
            return None
        return AttentionQuery(self.attention_layer, self.attention_head)


class AttentionOut(BaseModel):
    """One input's attention weights from one layer: ``weights[i][j]`` is how much row i attends to column j."""

    kind: Literal["cross", "self", "cls_to_patches"] = Field(
        description="cross: translation, rows = produced target tokens (</s> included when it ended), "
        "columns = source tokens; self: BERT, rows = columns = the tokens ([CLS] ... [SEP]); "
        "cls_to_patches: ViT, [CLS]'s row over the image patches, laid out as the patch grid"
    )
    layer: int = Field(description="0-based layer the weights come from")
    head: int | None = Field(description="0-based head, or null: the mean over heads")
    num_layers: int = Field(description="Layers the model has (valid attention_layer values)")
    num_heads: int = Field(description="Heads per layer (valid attention_head values)")
    rows: list[str] = Field(description="Row labels: target tokens, tokens, or patch-grid row numbers")
    columns: list[str] = Field(
        description="Column labels: source tokens, tokens, or patch-grid column numbers"
    )
    weights: list[list[float]] = Field(
        description="len(rows) lists of len(columns) weights, rounded to 5 decimals; each row of a cross or "
        "self map sums to 1 (within len(columns) x 0.5e-5)"
    )
    grid: list[int] | None = Field(
        default=None,
        description="cls_to_patches: [patch rows, patch columns] of the image (weights has this shape)",
    )
    cls_weight: float | None = Field(
        default=None,
        description="cls_to_patches: [CLS]'s weight on itself; with the grid's weights it sums to 1",
    )

    @classmethod
    def of(cls, a: AttentionMap | None) -> AttentionOut | None:
        if a is None:
            return None
        return cls(
            kind=a.kind,  # type: ignore[arg-type]
            layer=a.layer,
            head=a.head,
            num_layers=a.num_layers,
            num_heads=a.num_heads,
            rows=a.rows,
            columns=a.columns,
            weights=a.weights,
            grid=a.grid,
            cls_weight=a.cls_weight,
        )


class WithAttention(BaseModel):
    """A result that may carry ``attention``: the key is left out entirely when it was not asked for."""

    attention: AttentionOut | None = Field(
        default=None, description="Only with return_attention: the input's attention map"
    )

    @model_serializer(mode="wrap")
    def _omit_absent_attention(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and "attention" in data:
            attention = data.pop("attention")
            if attention is not None:
                data["attention"] = attention  # last: after the answer it explains
        return data
