"""Where the app's files are, and how they are served.

The repository keeps `static/`, `shaders/` and `templates/` at its top, beside `server/` (the
import package `andrea`); a built wheel carries them inside the package (`andrea/static`, ...,
see pyproject.toml). `asset_dir` finds them in either place, so an editable install, a wheel and
a checkout all serve the same files.

Static files and shaders are served twice: under a content-hashed prefix
(`/static/v-<hash>/...`, cached for a year and immutable: a new release gets new URLs, so a
browser never mixes cached old modules or shaders with new ones), and at their plain paths
(`/static/...`, revalidated on every use through their ETag) for links and tools.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from fastapi.staticfiles import StaticFiles

ASSET_DIRS = ("static", "shaders", "templates")
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


def asset_dir(name: str) -> Path:
    """static/, shaders/ or templates/: inside the installed package, else beside it (checkout)."""
    if name not in ASSET_DIRS:
        raise ValueError(f"unknown asset dir {name!r}")
    packaged = Path(str(resources.files("andrea"))) / name
    if packaged.is_dir():
        return packaged
    beside = Path(__file__).resolve().parent.parent / name
    if beside.is_dir():
        return beside
    raise RuntimeError(f"the app's {name}/ folder is missing: looked in {packaged} and {beside} "
                       "(a broken install? reinstall the andrea package)")


def content_version(*dirs: Path) -> str:
    """A short hash of every file's path and bytes under `dirs`: the asset URL prefix."""
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(path.relative_to(d)).encode() + b"\0")
            h.update(path.read_bytes())
    return "v-" + h.hexdigest()[:12]


class CachedFiles(StaticFiles):
    """StaticFiles with one Cache-Control policy, and optionally a fixed content type (WGSL is
    served as UTF-8 text so that fetch() and a human reader both get source)."""

    def __init__(self, *, directory: Path, cache_control: str, media_type: str | None = None):
        super().__init__(directory=directory)
        self.cache_control = cache_control
        self.media_type = media_type

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["cache-control"] = self.cache_control
        if self.media_type:
            response.headers["content-type"] = self.media_type
        return response
