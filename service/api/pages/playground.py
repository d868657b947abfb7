"""GET /playground: one static page to try every model through the public API; GET / sends a browser there.

The page (``service/static/playground/index.html``) has no build step and loads nothing from other
hosts; every call it makes goes through the same routes, limits, cache and metrics as any client's,
with the API key the user types (sent as ``Authorization: Bearer``). The page itself is open, like the
docs: it holds no data.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from litestar import Controller, MediaType, Response, get
from litestar.response import Redirect

PAGE = Path(__file__).resolve().parents[2] / "static" / "playground" / "index.html"


@cache
def _page() -> bytes:
    return PAGE.read_bytes()  # read once: it changes only with a new release


class PlaygroundController(Controller):
    path = "/"
    tags = ("playground",)
    include_in_schema = False

    @get("/playground", media_type=MediaType.HTML, cache_control=None)
    async def playground(self) -> Response[bytes]:
        return Response(_page(), media_type=MediaType.HTML, headers={"Cache-Control": "no-cache"})

    @get("/", status_code=307)
    async def root(self) -> Redirect:
        return Redirect("/playground", status_code=307)
