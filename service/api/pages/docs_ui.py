"""The API docs pages, served with their JavaScript and CSS from this service: they work offline.

Litestar's render plugins load their assets from public CDNs by default (jsDelivr, unpkg,
cdn.redoc.ly, Google Fonts), so behind a firewall every docs page renders blank. Here the assets are
pinned copies vendored under ``service/static/docs/`` with their licences (swagger-ui-dist 5.35.0,
redoc 2.5.4, both from the npm registry), served at ``/static/docs/``; fonts fall back to the
system's. The pages: ReDoc at ``/schema`` and ``/schema/redoc``, Swagger UI at ``/schema/swagger``,
and the document itself at ``/schema/openapi.json`` and ``/schema/openapi.yaml``. Stoplight Elements,
RapiDoc and Scalar are not offered: they would need more vendored bundles for the same document.
"""

from __future__ import annotations

from pathlib import Path

from litestar.datastructures import CacheControlHeader
from litestar.openapi.plugins import (
    JsonRenderPlugin,
    OpenAPIRenderPlugin,
    RedocRenderPlugin,
    SwaggerRenderPlugin,
    YamlRenderPlugin,
)
from litestar.router import Router
from litestar.static_files import create_static_files_router

ASSETS_DIR = Path(__file__).resolve().parents[2] / "static" / "docs"
ASSETS_PATH = "/static/docs"
SWAGGER_UI_VERSION = "5.35.0"
REDOC_VERSION = "2.5.4"


def render_plugins() -> list[OpenAPIRenderPlugin]:
    swagger = f"{ASSETS_PATH}/swagger-ui"
    favicon = (
        f"<link rel='icon' type='image/png' href='{swagger}/favicon-32x32.png'>"  # Litestar's is on a CDN
    )
    return [
        RedocRenderPlugin(
            version=REDOC_VERSION,
            favicon=favicon,
            js_url=f"{ASSETS_PATH}/redoc/redoc.standalone.js",
            google_fonts=False,
            path=["/", "/redoc"],
        ),
        SwaggerRenderPlugin(
            version=SWAGGER_UI_VERSION,
            favicon=favicon,
            js_url=f"{swagger}/swagger-ui-bundle.js",
            css_url=f"{swagger}/swagger-ui.css",
            standalone_preset_js_url=f"{swagger}/swagger-ui-standalone-preset.js",
            path="/swagger",
        ),
        JsonRenderPlugin(),
        YamlRenderPlugin(),
    ]


def assets_router() -> Router:
    """``/static/docs/...``: the vendored files, cacheable, outside the OpenAPI document."""
    return create_static_files_router(
        path=ASSETS_PATH,
        directories=[ASSETS_DIR],
        name="docs-assets",
        include_in_schema=False,
        cache_control=CacheControlHeader(max_age=86400, public=True),
    )
