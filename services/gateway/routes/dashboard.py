"""The dashboard page and its script: open; the page reads its data with the viewer's token."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

router = APIRouter()

STATIC = resources.files("services.gateway") / "static"


@router.get("/dashboard", response_class=HTMLResponse, tags=["operations"])
def dashboard() -> HTMLResponse:
    return HTMLResponse((STATIC / "dashboard.html").read_text())


@router.get("/dashboard.js", tags=["operations"], response_class=Response)
def dashboard_js() -> Response:
    return Response((STATIC / "dashboard.js").read_text(), media_type="text/javascript")
