"""HTML pages (Jinja2). Each page is a template plus one ES module under static/js/app/."""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from andrea.deps import TemplatesDep
from andrea.run_config import form_fields

router = APIRouter(default_response_class=HTMLResponse, include_in_schema=False)


def _render(templates: TemplatesDep, request: Request, template: str,
            **context) -> HTMLResponse:
    return templates.TemplateResponse(request, template, context)


@router.get("/")
def index(request: Request, templates: TemplatesDep):
    # The form's defaults, bounds and required marks are RunConfig's (run_config.py).
    return _render(templates, request, "index.html", title="New run", fields=form_fields())


@router.get("/runs/{run_id}")
def run_page(request: Request, templates: TemplatesDep, run_id: str):
    # The page loads the run through the API and says so itself when the run does not exist.
    return _render(templates, request, "run.html", title=f"Run {run_id}", run_id=run_id)


# Pages that need nothing but their template: path -> (template, title).
STATIC_PAGES = {
    "/runs": ("runs.html", "Runs"),
    "/compare": ("compare.html", "Compare runs"),
    "/diagnostics": ("diagnostics.html", "WebGPU diagnostics"),
    "/lab": ("lab.html", "Engine lab"),
    "/kernels": ("kernels.html", "Kernels"),
}


def _static_page(template: str, title: str):
    def page(request: Request, templates: TemplatesDep):
        return _render(templates, request, template, title=title)
    return page


for _path, (_template, _title) in STATIC_PAGES.items():
    router.add_api_route(_path, _static_page(_template, _title), methods=["GET"],
                         name=_template.removesuffix(".html"))
