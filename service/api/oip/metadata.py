"""What the Open Inference Protocol says about the server and each model, on HTTP and gRPC alike: the
server's name, version and extensions, and a model's metadata from its task's contract."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field

from service.api.oip.tasks import COMMON_PARAMETERS, NotOnV2Error, signature
from service.inference import ServedModel

SERVER_NAME = "transformer-serving"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "generate"]
PLATFORM = "onnxruntime_onnx"


class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(description="BYTES | FP32 | INT64 | ...")
    shape: list[int] = Field(description="-1 for a dynamic axis; the first axis is the batch")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(
        description="The served versions, newest first: version folder numbers, or the content hash of a "
        "model folder that is its only version"
    )
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="This service's additions: task, labels (the order of `probabilities`), request "
        "parameters the model takes",
    )


def server_version() -> str:
    try:
        return metadata.version(SERVER_NAME)
    except metadata.PackageNotFoundError:
        return "0"


def has_tensors(model: ServedModel) -> bool:
    """Whether a v2 client sees ``model``: its task declares tensors."""
    try:
        signature(model)
    except NotOnV2Error:
        return False
    return True


def model_metadata(model: ServedModel) -> ModelMetadata:
    sig = signature(model)
    params: dict[str, Any] = {
        "task": model.task,
        "request_parameters": {**sig.parameters, **COMMON_PARAMETERS},
        "inputs": {t.name: t.description for t in sig.inputs},
        "outputs": {t.name: t.description for t in sig.outputs},
    }
    if model.manifest.labels:
        params["labels"] = list(model.manifest.labels)
    return ModelMetadata(
        name=model.name,
        versions=list(model.versions),
        platform=PLATFORM,
        inputs=[
            TensorMetadata(name=t.name, datatype=t.datatype, shape=[int(d) for d in t.shape])
            for t in sig.inputs
        ],
        outputs=[
            TensorMetadata(name=t.name, datatype=t.datatype, shape=[int(d) for d in t.shape])
            for t in sig.outputs
        ],
        parameters=params,
    )
