"""Running a load client's coroutine: on uvloop when installed (it is, with uvicorn[standard]).

Client and server share the machine's cores; what the client's event loop costs is taken from the
server being measured, and uvloop's costs less.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a fresh uvloop event loop, or asyncio's own without uvloop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
