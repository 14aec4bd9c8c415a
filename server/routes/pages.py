"""HTML pages (Jinja2). Each page is a template plus one ES module under static/js/app/."""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from andrea import schemas
from andrea.data.bandit import PHASE_LENGTHS
from andrea.data.windows import PASSES_WARNING
from andrea.model import SHAPE_FIELDS
from andrea.run_config import RoomConfig, form_fields
from andrea.web.deps import StoreDep, TemplatesDep

router = APIRouter(default_response_class=HTMLResponse, include_in_schema=False)


def _render(templates: TemplatesDep, request: Request, template: str,
            status_code: int = 200, **context) -> HTMLResponse:
    return templates.TemplateResponse(request, template, context, status_code=status_code)


@router.get("/")
def index(request: Request, templates: TemplatesDep):
    # The form's defaults, bounds and required marks are RunConfig's (run_config.py); the
    # fields that make the model are what run_config.run_model reads; the bandit's phase
    # lengths and the data warning's passes are the data modules'.
    return _render(templates, request, "index.html", title="New run", fields=form_fields(),
                   room_fields=form_fields(RoomConfig),
                   shape_fields=("preset", *SHAPE_FIELDS, "seq_len"),
                   phase_lengths=PHASE_LENGTHS, passes_warning=PASSES_WARNING)


@router.get("/runs/{run_id}")
async def run_page(request: Request, templates: TemplatesDep, store: StoreDep, run_id: str):
    # The page loads the run through the API; an unknown run is a 404 page that says so.
    run = await store.run(store.runs.get, run_id)
    if run is None:
        return _render(templates, request, "not_found.html", status_code=404,
                       title="No such run", what=f"There is no run {run_id} on this server.")
    if run["config"].room is not None:      # trained by the tabs that join it: its room's page
        return _render(templates, request, "room.html", title=run["name"], run_id=run_id,
                       run_name=run["name"])
    return _render(templates, request, "run.html", title=run["name"], run_id=run_id,
                   run_name=run["name"], name_max=schemas.NAME_MAX, notes_max=schemas.NOTES_MAX,
                   prompt_max=schemas.MAX_PROMPT_CHARS)


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
