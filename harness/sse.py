"""Server-Sent Events out of a streamed response (``HTTPConnection.stream``'s chunks)."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def sse_events(chunks: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[tuple[int, str, str]]:
    """(status, event name, data) per Server-Sent Event of a streamed response.

    A response that is no event stream (an HTTP error answered as JSON) comes out as one
    (status, "", body) item.
    """
    buffer, status, events = b"", 0, 0
    async for status, chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            event, data = "message", []
            for line in block.decode().split("\n"):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            if data or event != "message":
                events += 1
                yield status, event, "\n".join(data)
    if not events:
        yield status, "", buffer.decode(errors="replace")
