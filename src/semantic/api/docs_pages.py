"""The API's pages for people, /docs (Swagger UI) and /redoc (ReDoc), from files the server
serves itself, so they work on a machine with no network, as the server does.

The scripts and styles are those the `fastapi-offline` package ships (Swagger UI 5, which reads
OpenAPI 3.1); FastAPI's own pages would load them from a CDN.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS = "/docs/assets"
# An empty favicon: no request at all (FastAPI's default is a file on its own web site).
FAVICON = "data:,"


def install(app: FastAPI) -> None:
    """Serve /docs, its OAuth2 redirect, /redoc and their assets. The app must be made with
    `docs_url=None, redoc_url=None`, so FastAPI's own pages do not take the paths first."""
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} {app.version}"

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} — routes",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=FAVICON,
            oauth2_redirect_url="/docs/oauth2-redirect",
            # No badge from Swagger's online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} — routes",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=FAVICON,
            with_google_fonts=False,
        )

    app.add_api_route("/docs", swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs/oauth2-redirect", oauth2_redirect, include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS, StaticFiles(directory=assets_folder()), name="docs-assets")


def assets_folder() -> Path:
    """The folder of Swagger UI's and ReDoc's files, found without importing their package."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the fastapi-offline package (Swagger UI's files) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"
