"""Serves the console's files from the package (no CDN, no build step) under a strict Content-Security-Policy.

The console is a static single-page app: the browser keeps the API key in the tab's sessionStorage and calls the
public /v1 routes with it as the bearer token; nothing about the operator is stored on the server. The routes stay
out of openapi.yaml: they are not part of the API contract.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.errors import NotFound

STATIC = Path(__file__).resolve().parent / "static"

# No inline script or style anywhere, no framing, nothing fetched from another origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}

router = APIRouter(prefix="/console", include_in_schema=False)


def _file(relative: str) -> FileResponse:
    path = (STATIC / relative).resolve()
    media_type = MEDIA_TYPES.get(path.suffix)
    # Only files of the package's static folder, of a known type: no traversal, no directory listings.
    if media_type is None or not path.is_relative_to(STATIC) or not path.is_file():
        raise NotFound("no such console file")
    return FileResponse(path, media_type=media_type, headers=HEADERS)


@router.get("")
async def console_root() -> Response:
    return RedirectResponse("/console/", status_code=308, headers=HEADERS)


@router.get("/")
async def console_index() -> FileResponse:
    return _file("index.html")


@router.get("/{relative:path}")
async def console_asset(relative: str) -> FileResponse:
    return _file(relative)
