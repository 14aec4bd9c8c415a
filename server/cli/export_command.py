"""`andrea export`: a run's Hugging Face folder written from the data dir (export_local) or
fetched from a running server's export.zip (fetch_export); the folder's contents are
export.py's."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from andrea.export import NoWeights, clear_tokenizer, export_run, tokenizer_path


class UsageError(ValueError):
    """The run or its database is not there, or the folder to write holds something: the
    command was asked the wrong thing."""


def default_out(run_id: str, step: int | None) -> Path:
    """Where `andrea export` writes without --out: ./RUN_ID, or ./RUN_ID-stepK for a checkpoint
    (the id, not the run's name: names have spaces and slashes, and need not be unique)."""
    return Path(run_id if step is None else f"{run_id}-step{step}")


def _default_out(run_id: str, step: int | None) -> Path:
    """default_out, refused where it holds something: a folder nobody named is not replaced."""
    out = default_out(run_id, step)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty: give --out DIR to write elsewhere, "
                         "or to replace the checkpoint files there")
    return out


def export_local(data_dir: Path, run_id: str, out: Path | None, step: int | None = None,
                 database_url: str | None = None, corpus_dir: Path | None = None) -> Path:
    """`andrea export RUN_ID [--out OUT] [--step K]`: the run, its metrics and tokenizer from a
    data dir (and the database at `database_url`, ANDREA_DATABASE_URL, when it is not the data
    dir's SQLite file); with `step`, the weights of that checkpoint. `corpus_dir`: where the
    tokenizer and token files are (ANDREA_CACHE_DIR; default the data dir). `out` None:
    default_out, once the run is known (an unknown run is said as such)."""
    from andrea.store import Store

    data_dir = Path(data_dir).resolve()
    if not database_url and not (data_dir / "andrea.sqlite").exists():
        raise UsageError(f"no database in {data_dir}")
    store = Store.open(database_url, data_dir / "andrea.sqlite")
    try:
        run = store.runs.get(run_id)
        if run is None:
            raise UsageError(f"unknown run {run_id!r} in {data_dir}")
        records = store.metrics.card_summary(run_id, step)
    finally:
        store.close()
    out = Path(out) if out is not None else _default_out(run_id, step)
    corpus_dir = corpus_dir or data_dir
    return export_run(run, data_dir, tokenizer_path(corpus_dir, run), out, records, step,
                      corpus_dir)


def fetch_export(server: str, run_id: str, out: Path | None, step: int | None = None) -> Path:
    """`andrea export RUN_ID --server URL [--out OUT] [--step K]`: the same files, made by the
    server (GET /api/runs/{id}/export.zip[?step=K] runs export_run there) and unpacked here."""
    import tempfile
    import urllib.parse

    base = f"{server.rstrip('/')}/api/runs/{urllib.parse.quote(run_id, safe='')}"
    _http_get(base, run_id, server)   # an unknown run is a usage error, not a failure
    out = Path(out) if out is not None else _default_out(run_id, step)
    with tempfile.TemporaryFile() as tmp:
        query = "" if step is None else f"?step={int(step)}"
        _http_get(base + "/export.zip" + query, run_id, server, into=tmp)
        return unzip_checkpoint(tmp, out)


def _http_get(url: str, run_id: str, server: str, into=None) -> None:
    from andrea.cli import http_client

    try:
        http_client.request("GET", url, timeout=600, into=into)
    except http_client.ServerError as e:
        if e.status == 404 and into is None:
            raise UsageError(f"unknown run {run_id!r} on {server}") from None
        if e.status == 404:     # the run is there (asked first): its weights or checkpoint not
            raise NoWeights(e.detail) from None
        raise OSError(f"{server} answered {e.status}: {e.detail}") from None
    except http_client.Unreachable as e:
        raise OSError(f"cannot reach {server}: {e.reason}") from None


def unzip_checkpoint(file, out: Path) -> Path:
    """Plain file names only: an archive cannot write outside `out`. ValueError for what is no
    whole zip archive (a body cut short, damaged)."""
    try:
        return _unzip(file, out)
    except zipfile.BadZipFile as e:
        raise ValueError(f"the export is not a whole zip archive: {e}") from None


def _unzip(file, out: Path) -> Path:
    with zipfile.ZipFile(file) as zf:
        names = zf.namelist()
        bad = [n for n in names if Path(n).name != n or n in ("", ".", "..")]
        if bad:
            raise ValueError(f"unexpected path in the export archive: {bad[0]!r}")
        out.mkdir(parents=True, exist_ok=True)
        clear_tokenizer(out)
        for name in names:
            with zf.open(name) as src, open(out / name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return out
