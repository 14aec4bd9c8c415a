"""One Settings object for the whole server, read from the environment the ecosystem way:
ANDREA_HOST, ANDREA_PORT, ANDREA_DATA_DIR, ANDREA_CHECKPOINTS_KEPT, ... (command-line flags
override them). The default data
dir is the platform's user data folder, the same for `serve`, `train` and `export`."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """~/.local/share/andrea on Linux, ~/Library/Application Support/andrea on macOS, ..."""
    return Path(platformdirs.user_data_dir("andrea", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ANDREA_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    # Seconds a running run may go without its trainer socket before it is marked interrupted.
    trainer_grace_s: float = 60.0
    # Checkpoints kept per run (the newest ones); older ones are deleted after each upload.
    checkpoints_kept: int = Field(2, ge=1)
    # User text sources beside the embedded default: (name, file or folder), `--corpus NAME=PATH`.
    corpora: tuple[tuple[str, Path], ...] = ()

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "andrea.sqlite"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def allowed_origins(self) -> tuple[str, ...]:
        # Websocket origin check: the page must come from this very server.
        hosts = {self.host, "127.0.0.1", "localhost"}
        return tuple(f"http://{h}:{self.port}" for h in sorted(hosts))
