"""Open Inference Protocol v2 (KServe v2 / Triton) bodies: metadata, health, infer, generate, errors.

Field names and shapes are the protocol's (KServe ``required_api.md``, Triton's
generate extension); extra fields the protocol allows (``parameters``) carry
what this service adds. ``docs/OPEN_INFERENCE_PROTOCOL.md`` has each model's tensors.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, StrictInt, model_serializer

Parameter = str | int | float | bool


class V2ErrorBody(BaseModel):
    error: str = Field(description="What went wrong (the HTTP status says which kind)")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str] = Field(description="Protocol extensions: binary_tensor_data, generate, ...")


class LiveOut(BaseModel):
    live: bool


class ReadyOut(BaseModel):
    ready: bool


class ModelReadyOut(BaseModel):
    name: str
    ready: bool


class RequestInput(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    shape: list[StrictInt] = Field(max_length=8, description="Non-negative integers (not booleans or 2.0)")
    datatype: str = Field(min_length=1, max_length=16)
    parameters: dict[str, Any] | None = Field(
        default=None, description="`binary_data_size`: the tensor's bytes follow the JSON header"
    )
    data: Any = Field(default=None, description="Row-major values, flat or nested; BYTES as strings")


class RequestOutput(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    parameters: dict[str, Any] | None = Field(default=None, description="`binary_data`: answer as binary")


class InferRequest(BaseModel):
    """``$inference_request``; unknown top-level fields are ignored (some clients send ``model_name``)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = Field(default=None, max_length=256)
    parameters: dict[str, Any] | None = Field(
        default=None,
        description="`binary_data_output` (all outputs as binary), `cache` (false: skip the response-cache "
        "look-up), and the model's own (generation: max_tokens, temperature, ...)",
    )
    inputs: list[RequestInput] = Field(min_length=1, max_length=16)
    outputs: list[RequestOutput] | None = Field(default=None, max_length=16)


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = Field(default=None, description="`binary_data_size` when binary")
    data: list[Any] | None = Field(default=None, description="Flat row-major values (JSON outputs)")


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="`cached`, token counts (`input_tokens`, `output_tokens`)"
    )
    outputs: list[ResponseOutput]


class GenerateRequest(BaseModel):
    """Triton's generate extension; top-level fields besides these are parameters too (as Triton passes them)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(default=None, max_length=256)
    text_input: str = Field(description="The prompt (gpt) or the English source text (translator)")
    parameters: dict[str, Parameter] | None = Field(
        default=None, description="Sampling (gpt) or decoding (translator) parameters, as for infer"
    )


class GenerateResponse(BaseModel):
    id: str | None = None
    model_name: str
    model_version: str
    text_output: str = Field(description="The completion (without the prompt), or the translation")
    finish_reason: str = Field(
        description="length | stop | eos | deadline (the request's timeout passed while it decoded)"
    )

    @model_serializer(mode="wrap")
    def _id_only_when_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("id") is None:
            data.pop("id", None)
        return data


class RepositoryIndexRequest(BaseModel):
    ready: bool | None = Field(default=None, description="true: only models ready for inference")


class RepositoryControlRequest(BaseModel):
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="The protocol's load and unload parameters; `config` and `file:...` are refused (a model "
        "loads from its own folder)",
    )


class RepositoryModel(BaseModel):
    name: str
    version: str | None = None
    state: str = Field(description="READY | LOADING | UNAVAILABLE")
    reason: str = ""
