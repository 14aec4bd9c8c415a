"""HTML pages (Jinja2). Each page is a template plus one ES module under static/js/app/."""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

router = APIRouter()


def _render(request: Request, template: str, **context) -> HTMLResponse:
    templates = request.app.state.templates
    return templates.TemplateResponse(request, template, context)


@router.get("/", response_class=HTMLResponse)
def index(request: Request):
    return _render(request, "index.html", title="New run")


@router.get("/runs", response_class=HTMLResponse)
def runs_page(request: Request):
    return _render(request, "runs.html", title="Runs")


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str):
    # The page loads the run through the API and says so itself when the run does not exist.
    return _render(request, "run.html", title=f"Run {run_id}", run_id=run_id)


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request):
    return _render(request, "compare.html", title="Compare runs")


@router.get("/diagnostics", response_class=HTMLResponse)
def diagnostics(request: Request):
    return _render(request, "diagnostics.html", title="WebGPU diagnostics")


@router.get("/lab", response_class=HTMLResponse)
def lab(request: Request):
    return _render(request, "lab.html", title="Engine lab")


@router.get("/kernels", response_class=HTMLResponse)
def kernels_page(request: Request):
    return _render(request, "kernels.html", title="Kernels")
