"""Errors on the gRPC door: the core's ``Problem`` as a gRPC status.

Nothing is classified here: each kind's gRPC code is in the core's one table (``service/errors.py``):
a bad tensor or parameter is ``INVALID_ARGUMENT`` naming it (what Triton answers), an unknown model
``NOT_FOUND``, a full queue ``RESOURCE_EXHAUSTED``, a service starting, draining or stopping
``UNAVAILABLE``; anything else is ``INTERNAL`` and logged.
"""

from __future__ import annotations

import grpc

from service.errors import problem_of


def status_of(exc: BaseException, where: str = "gRPC") -> tuple[grpc.StatusCode, str]:
    """The status code and message for ``exc`` (field first, as on HTTP: ``text[0]: must not be empty``)."""
    problem = problem_of(exc, where)
    return getattr(grpc.StatusCode, problem.grpc), problem.text
