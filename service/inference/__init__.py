"""What the HTTP layer calls: the InferenceService facade and the registry that resolves a request's model.

The per-task pipelines it runs live in ``service.pipelines``; the engines they
drive in ``service.engine``; the response cache in ``service.cache``.
"""

from .service import InferenceService

__all__ = ["InferenceService"]
