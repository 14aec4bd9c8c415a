"""HTML pages (Jinja2). Each page is a template plus one ES module under static/js/app/."""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

router = APIRouter()


def _render(request: Request, template: str, **context) -> HTMLResponse:
    templates = request.app.state.templates
    return templates.TemplateResponse(request, template, context)


@router.get("/", response_class=HTMLResponse)
def index(request: Request):
    return _render(request, "index.html", title="Andrea")


@router.get("/diagnostics", response_class=HTMLResponse)
def diagnostics(request: Request):
    return _render(request, "diagnostics.html", title="WebGPU diagnostics")


@router.get("/lab", response_class=HTMLResponse)
def lab(request: Request):
    return _render(request, "lab.html", title="Engine lab")
