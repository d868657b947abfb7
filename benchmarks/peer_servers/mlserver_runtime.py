"""MLServer's custom runtime for the fused classifier (``mlserver_server.py`` names it in model-settings.json).

``predict`` gets a batch MLServer's adaptive batcher stacked along the first axis (one text per request)
and answers two outputs of the same first axis, which MLServer splits back into one answer per request.
"""

from __future__ import annotations

import numpy as np
from classifier import FusedClassifier, PeerSettings
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class FusedClassifierRuntime(MLModel):
    async def load(self) -> bool:
        self.model = FusedClassifier.from_settings(PeerSettings.from_env())
        self.model.probabilities([self.model.encode("warm-up")])  # as the service warms up
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        texts = StringCodec.decode_input(payload.inputs[0])  # one per request in the batch
        probs = self.model.probabilities([self.model.encode(t) for t in texts])  # (B, labels) float64
        best = np.argmax(probs, axis=-1)
        scores = probs[np.arange(len(best)), best][:, None]  # (B, 1)
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                StringCodec.encode_output("label", [self.model.labels[b] for b in best]),
                NumpyCodec.encode_output("score", scores),
            ],
        )
