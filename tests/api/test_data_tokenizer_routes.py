"""The tokenizer routes: the browser's decode table gives each token's UTF-8 bytes, and the
tokenizer.json served is a standard one (the tokenizer and its caches:
tests/service/test_data_tokenizer.py)."""

from __future__ import annotations

import base64

from tokenizers import Tokenizer

from andrea.data import tokenizer as tk
from tests.data_fixtures import TINY_V
from tests.service.test_data_tokenizer import NON_ASCII


def test_decode_table_gives_utf8_bytes(tiny, data_client):
    body = data_client.get("/api/tokenizer/tiny").json()
    table = [base64.b64decode(b) for b in body["token_bytes_b64"]]
    assert len(table) == body["n_tokens"] == TINY_V and body["eot_id"] == 0
    assert table[0] == tk.EOT.encode() and sorted(table[1:257]) == [bytes([b]) for b in range(256)]
    for text in NON_ASCII:
        ids = tiny.tokenizer.encode(text).ids
        assert b"".join(table[i] for i in ids) == text.encode("utf-8")
    by_size = data_client.get("/api/tokenizer/512").json()
    assert by_size["token_bytes_b64"] == body["token_bytes_b64"]


def test_tokenizer_json_is_standard(tiny, data_client, tmp_path):
    r = data_client.get("/api/tokenizer/tiny/tokenizer.json")
    assert r.status_code == 200
    (tmp_path / "tokenizer.json").write_bytes(r.content)
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = NON_ASCII[0]
    assert loaded.encode(text).ids == tiny.tokenizer.encode(text).ids
    assert data_client.get("/api/tokenizer/nope").status_code == 404
    assert data_client.get("/api/tokenizer/12").status_code == 404
