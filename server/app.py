"""App factory: mounts /static and /shaders, includes one router per resource."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from server import __version__
from server.config import Settings
from server.data.hub import DataHub
from server.data.runs import RunRegistry
from server.routes import data, health, pages, presets


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
    app.state.templates = Jinja2Templates(directory=str(settings.templates_dir))
    app.mount("/static", StaticFiles(directory=settings.static_dir), name="static")
    app.mount("/shaders", ShaderFiles(directory=settings.shaders_dir), name="shaders")
    app.include_router(health.router)
    app.include_router(pages.router)
    app.include_router(presets.router)
    # Data is read and tokenized lazily, on first use, so page loads and tests stay fast.
    app.state.data = DataHub(settings.data_dir, settings.corpora)
    app.state.runs = RunRegistry()
    app.include_router(data.router)
    return app
