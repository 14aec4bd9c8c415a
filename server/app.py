"""App factory: mounts /static and /shaders, includes one router per resource."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from server import __version__, telemetry
from server.config import Settings
from server.data.hub import DataHub
from server.data.runs import RunRegistry
from server.routes import data, health, pages, presets, runs
from server.store import Store


class ShaderFiles(StaticFiles):
    """WGSL served as UTF-8 text so both fetch() and a human reader get source."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["content-type"] = "text/plain; charset=utf-8"
        return response


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(title="Andrea", version=__version__)
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.state.templates = Jinja2Templates(directory=str(settings.templates_dir))
    app.mount("/static", StaticFiles(directory=settings.static_dir), name="static")
    app.mount("/shaders", ShaderFiles(directory=settings.shaders_dir), name="shaders")
    uplot = settings.vendor_dir / "uplot" / "dist"
    if uplot.is_dir():
        app.mount("/vendor/uplot", StaticFiles(directory=uplot), name="uplot")
    else:
        @app.get("/vendor/uplot/{path:path}", include_in_schema=False)
        def _no_uplot(path: str):
            return JSONResponse({"detail": "uPlot is not installed: run `npm ci` in the checkout "
                                 "(bash scripts/serve does it)"}, status_code=404)
    app.include_router(health.router)
    app.include_router(pages.router)
    app.include_router(presets.router)
    # Data is read and tokenized lazily, on first use, so page loads and tests stay fast.
    app.state.data = DataHub(settings.data_dir, settings.corpora)
    app.state.store = store = Store(settings.db_path)
    app.state.hub = telemetry.Hub()

    def load_spec(run_id: str):
        run = store.get_run(run_id)
        return runs.batch_spec(run["config"]) if run else None

    def replay_source_losses(run_id: str):
        for rec in store.metrics(run_id):
            for source, loss in (rec.get("source_losses") or {}).items():
                yield rec["step"], int(source), loss

    app.state.runs = RunRegistry(loader=load_spec, replay=replay_source_losses)
    app.state.runs_feedback = lambda run_id, records: _feed_bandit(app, run_id, records)
    app.include_router(data.router)
    app.include_router(runs.router)
    app.include_router(telemetry.router)
    return app


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with where and why, without echoing the input (which may hold NaN, not JSON)."""
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse({"detail": detail}, status_code=422)


def _feed_bandit(app: FastAPI, run_id: str, records) -> None:
    """Per-source training losses from telemetry go to the run's bandit (bandit runs only,
    whose bandit exists once their first batch was served)."""
    bandit = app.state.runs.started_bandit(run_id)
    if bandit is None:
        return
    for r in records:
        for source, loss in (r.source_losses or {}).items():
            bandit.report(r.step, int(source), loss)
