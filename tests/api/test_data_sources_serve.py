"""Corpus sources at `andrea serve` and over HTTP: bad corpora refused at start in one line,
--only-corpus serving the user's sources alone, bad files skipped and named, and a run the corpus
cannot serve refused with the sizes (the sources themselves: tests/service/test_data_sources.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.cli.main import main
from andrea.data.sources import corpus_hash, load_sources
from tests.service.test_data_sources import _folder_with_bad_files, _write, user_corpus


def test_serve_refuses_bad_corpus_at_start(tmp_path, capsys):
    code = main(["serve", "--data-dir", str(tmp_path), "--corpus", f"mine={tmp_path / 'nope'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error" in err and "nope" in err and "no such file" in err
    assert main(["serve", "--data-dir", str(tmp_path), "--corpus", "oops"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err


def test_serve_only_corpus_exposes_only_the_users_sources(tmp_path):
    """`andrea serve --only-corpus --corpus ...`: GET /api/corpus lists the user's sources and
    nothing else, under their own hash, with a tokenizer trained on that text; batches come from
    them. The embedded sources are never read (the server starts without them)."""
    import urllib.request

    from andrea.cli.launch import free_port, stop_server
    from andrea.data import wire

    notes, letters = user_corpus(tmp_path / "notes"), user_corpus(tmp_path / "letters", "letters")
    port, data = free_port(), tmp_path / "data"
    cmd = [sys.executable, "-m", "andrea", "serve", "--port", str(port), "--data-dir", str(data),
           "--no-warm-data", "--only-corpus", "--corpus", f"notes={notes}",
           "--corpus", f"letters={letters}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            assert proc.poll() is None, proc.stdout.read()
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        with urllib.request.urlopen(url + "/api/corpus?preset=tiny", timeout=60) as r:
            body = json.load(r)
        assert [s["name"] for s in body["sources"]] == ["notes", "letters"]
        assert {s["kind"] for s in body["sources"]} == {"user"}
        expected = corpus_hash(load_sources((("notes", notes), ("letters", letters)),
                                            include_default=False))
        assert body["corpus_hash"] == expected
        assert expected != corpus_hash(load_sources((("notes", notes), ("letters", letters))))
        with urllib.request.urlopen(url + "/api/tokenizer/tiny/tokenizer.json") as r:
            vocab = json.load(r)["model"]["vocab"]
        assert "Ġzyzzyva" in vocab            # merges learnt from the user's text
        with urllib.request.urlopen(url + "/api/batches/0?preset=tiny&batch_size=16") as r:
            assert r.headers["x-andrea-sources"] == "notes,letters"
            assert set(wire.decode(r.read()).sources.tolist()) <= {0, 1}
    finally:
        stop_server(proc)
    out = proc.stdout.read()
    assert "corpus notes (" in out and "python-docs" not in out


def test_only_corpus_without_a_corpus_is_a_usage_error(tmp_path, capsys, monkeypatch):
    assert main(["serve", "--data-dir", str(tmp_path), "--only-corpus"]) == 2
    err = capsys.readouterr().err
    assert "--only-corpus" in err and "--corpus NAME=PATH" in err
    monkeypatch.setenv("ANDREA_ONLY_CORPUS", "1")             # the setting, too
    assert main(["serve", "--data-dir", str(tmp_path)]) == 2
    assert "--only-corpus" in capsys.readouterr().err


def test_serve_help_says_only_corpus(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--only-corpus" in out and "serve only the --corpus sources" in out


def test_a_single_binary_file_given_directly_stops_serve_with_one_line(tmp_path, capsys):
    blob = _write(tmp_path / "blob.txt", b"abc\x00\x01\x02")
    latin = _write(tmp_path / "latin1.txt", "café".encode("latin-1"))
    for path, why in ((blob, "looks binary"), (latin, "not UTF-8")):
        code = main(["serve", "--data-dir", str(tmp_path / "d"), "--only-corpus",
                     "--corpus", f"mine={path}"])
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("andrea serve: ") and str(path) in err and why in err


def _tiny_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "only.txt").write_text("Just a few words, far fewer than a row.\n")
    return folder


def test_a_run_the_corpus_cannot_serve_is_refused_with_the_sizes(tmp_path):
    """A corpus too small for a run's rows was accepted, and every run failed at batch 0; now
    POST /api/runs answers 422 with the tokens there are and those a row needs, and stores
    nothing. A run that picks sources needs each of them to hold a row."""
    from fastapi.testclient import TestClient

    from andrea.app import create_app
    from andrea.config import Settings

    tiny = _tiny_corpus(tmp_path / "tiny")
    settings = Settings(data_dir=tmp_path / "d", corpora=(("small", tiny),), only_corpus=True)
    with TestClient(create_app(settings)) as c:
        n = c.get("/api/corpus?preset=tiny").json()["sources"][0]
        r = c.post("/api/runs", json={"preset": "tiny"})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "65 tokens (seq_len + 1)" in detail and "vocab 512" in detail
        assert f"small: {n['train_tokens']} training, {n['val_tokens']} held out" in detail
        assert c.post("/api/runs", json={"preset": "tiny", "seq_len": 2, "sources": ["small"]}
                      ).status_code == 201         # 3 tokens: it holds that
        assert len(c.get("/api/runs").json()) == 1

    big = user_corpus(tmp_path / "big", "big")
    settings = Settings(data_dir=tmp_path / "d2", corpora=(("big", big), ("small", tiny)),
                        only_corpus=True)
    with TestClient(create_app(settings)) as c:
        c.get("/api/corpus?preset=tiny")      # (the form's call: the token files are made)
        assert c.post("/api/runs", json={"preset": "tiny"}).status_code == 201
        assert c.post("/api/runs", json={"preset": "tiny", "sources": ["big"]}
                      ).status_code == 201
        r = c.post("/api/runs", json={"preset": "tiny", "sources": ["small", "big"]})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "picked source holds" in detail and "(small: " in detail and "big:" not in detail
        assert len(c.get("/api/runs").json()) == 2


def test_serve_skips_bad_files_says_so_and_warns_of_a_corpus_too_small(tmp_path):
    """`andrea serve` on a folder with a binary and a latin-1 file serves the rest: its corpus
    line says what was read and skipped, a warning names each skipped file and why, and once the
    presets' data is prepared a warning says the corpus is too small for the largest preset's
    context; a run of that context is refused (422)."""
    import threading
    import urllib.error
    import urllib.request

    from andrea.cli.launch import free_port, stop_server

    folder = _folder_with_bad_files(tmp_path / "mixed", docs=40)
    port, data = free_port(), tmp_path / "data"
    cmd = [sys.executable, "-m", "andrea", "serve", "--port", str(port), "--data-dir", str(data),
           "--only-corpus", "--corpus", f"mixed={folder}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert proc.poll() is None, "".join(lines)
            if any("too small for preset 120m" in line for line in lines):
                break
            time.sleep(0.1)
        out = "".join(lines)
        assert "too small for preset 120m's context of 1,024 tokens" in out, out
        assert "1,025 tokens" in out and "vocab 8192" in out and "held out)" in out
        assert "presets that fit: tiny" in out
        with urllib.request.urlopen(url + "/api/corpus?preset=tiny", timeout=60) as r:
            assert [s["documents"] for s in json.load(r)["sources"]] == [40]
        req = urllib.request.Request(url + "/api/runs", method="POST",
                                     data=json.dumps({"preset": "120m"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 422 and "1,025 tokens" in json.load(e.value)["detail"]
    finally:
        stop_server(proc)
        reader.join(10)
    out = "".join(lines)
    assert "Andrea: corpus mixed (" in out and "from 40 files; skipped 2: blob.txt, " in out
    assert f"skipped {folder / 'blob.txt'}: looks binary" in out
    assert f"skipped {folder / 'sub' / 'latin1.md'}: not UTF-8" in out
