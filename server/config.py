"""One Settings object for the whole server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# The repository root holds static/, shaders/ and templates/ beside the server package.
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = field(default_factory=lambda: ROOT / "data")
    static_dir: Path = ROOT / "static"
    shaders_dir: Path = ROOT / "shaders"
    templates_dir: Path = ROOT / "templates"
    vendor_dir: Path = ROOT / "node_modules"   # npm packages the pages import (uPlot)
    # Seconds a running run may go without its trainer socket before it is marked interrupted.
    trainer_grace_s: float = 60.0
    # User text sources beside the embedded default: (name, file or folder), `--corpus NAME=PATH`.
    corpora: tuple[tuple[str, Path], ...] = ()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "andrea.sqlite"

    @property
    def allowed_origins(self) -> tuple[str, ...]:
        # Websocket origin check: the page must come from this very server.
        hosts = {self.host, "127.0.0.1", "localhost"}
        return tuple(f"http://{h}:{self.port}" for h in sorted(hosts))
