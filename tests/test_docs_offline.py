"""The API docs work without internet: every HTML page the service serves loads its assets from the
service itself, and those assets are there.

The check is on what a browser would fetch: ``src``/``href`` attributes, ``url(...)`` in inline CSS and
the script URLs the pages configure. Any absolute URL to another host fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlparse

import httpx
import pytest

from service.settings import Settings
from tests.servers import LiveServer

# Every HTML page the service serves (the docs UIs; /schema is ReDoc).
HTML_PAGES = ["/schema", "/schema/redoc", "/schema/swagger"]
# What Litestar offered before and cannot render offline: not served at all.
DROPPED = ["/schema/elements", "/schema/rapidoc"]
_URL_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)["']?\s*\)""", re.I)
_ANY_ABSOLUTE = re.compile(r"""["'(]((?:https?:)?//[^"')\s]+)""", re.I)


@pytest.fixture(scope="module")
def docs(tiny_models: Path) -> Iterator[tuple[str, httpx.Client]]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, API_KEYS="k1")
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield server.url, client


def _references(html: str) -> list[str]:
    return [a or b for a, b in _URL_ATTR.findall(html)]


@pytest.mark.parametrize("page", HTML_PAGES)
def test_a_docs_page_references_no_outside_host(docs: tuple[str, httpx.Client], page: str) -> None:
    url, client = docs
    response = client.get(page)  # open without an API key, as the docs are
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    outside = [
        u for u in _ANY_ABSOLUTE.findall(html) if urlparse(urljoin(url, u)).netloc != urlparse(url).netloc
    ]
    assert not outside, f"{page} references other hosts: {outside}"
    local = [u for u in _references(html) if not u.startswith(("data:", "#"))]
    assert any(u.endswith(".js") for u in local), f"{page} loads no script: {local}"
    for ref in local:  # every asset the page loads is served, with a sensible type
        asset = client.get(urljoin(url + page, ref))
        assert asset.status_code == 200, f"{page}: {ref} -> {asset.status_code}"
        kind = asset.headers["content-type"]
        if ref.endswith(".js"):
            assert "javascript" in kind and len(asset.content) > 100_000, (ref, kind, len(asset.content))
        elif ref.endswith(".css"):
            assert kind.startswith("text/css"), (ref, kind)


def test_the_pages_load_the_vendored_versions(docs: tuple[str, httpx.Client]) -> None:
    _, client = docs
    swagger = client.get("/schema/swagger").text
    assert "/static/docs/swagger-ui/swagger-ui-bundle.js" in swagger
    assert "/static/docs/swagger-ui/swagger-ui.css" in swagger
    bundle = client.get("/static/docs/swagger-ui/swagger-ui-bundle.js").content
    assert b"5.35.0" in bundle[:2_000_000]  # swagger-ui-dist's version string: OpenAPI 3.1 needs 5.x
    assert "/static/docs/redoc/redoc.standalone.js" in client.get("/schema/redoc").text
    assert client.get("/schema/openapi.json").json()["openapi"].startswith("3.1")


@pytest.mark.parametrize("page", DROPPED)
def test_docs_uis_that_need_a_cdn_are_not_served(docs: tuple[str, httpx.Client], page: str) -> None:
    _, client = docs
    assert client.get(page).status_code == 404


def test_the_vendored_licences_ship_with_the_assets() -> None:
    root = Path(__file__).resolve().parents[1] / "service" / "static" / "docs"
    assert "Apache License" in (root / "swagger-ui" / "LICENSE").read_text()
    assert "MIT License" in (root / "redoc" / "LICENSE").read_text()
