"""The gateway's token store, upload parser and OpenAPI spec, without a server."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from services.gateway.app import create_app
from services.gateway.backends import Backends
from services.gateway.datasets import DatasetError, parse_dataset
from services.gateway.tokens import Role, TokenError, TokenStore


def test_tokens_verify_by_role_and_refuse_the_rest(tmp_path: Path) -> None:
    store = TokenStore(str(tmp_path / "t.db"))
    admin, info = store.create("admin", "office")
    analyst, _ = store.create("analyst", "")
    who = store.verify(admin)
    assert who.name == "office" and who.role is Role.ADMIN and who.token_id == info.id
    assert who.may(Role.ANALYST) and who.may(Role.ADMIN)
    assert not store.verify(analyst).may(Role.ADMIN)
    for bad, text in {
        "": "malformed",
        "capc_x": "malformed",
        admin[:-1] + ("A" if admin[-1] != "A" else "B"): "unknown token",
        "capc_0000000000000000_" + admin.split("_", 2)[2]: "unknown token",
    }.items():
        with pytest.raises(TokenError, match=text):
            store.verify(bad)
    store.revoke(info.id)
    with pytest.raises(TokenError, match="revoked"):
        store.verify(admin)
    with pytest.raises(TokenError, match="unknown role"):
        store.create("root", "x")
    with pytest.raises(TokenError, match="expire within"):
        store.create("admin", "x", days=0)
    assert {t.name: t.revoked for t in store.tokens()} == {"analyst": False, "office": True}


def npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def test_datasets_npy_and_npz() -> None:
    x = np.random.default_rng(0).random((5, 1, 8, 8))
    assert parse_dataset(npy(x)).dtype == np.float32
    buf = io.BytesIO()
    np.savez(buf, x=x, y=np.arange(5))
    np.testing.assert_array_equal(parse_dataset(buf.getvalue()), x.astype(np.float32))
    buf = io.BytesIO()
    np.savez(buf, a=x, b=x)
    with pytest.raises(DatasetError, match="name the queries array 'x'"):
        parse_dataset(buf.getvalue())
    with pytest.raises(DatasetError, match="numbers"):
        parse_dataset(npy(np.array([["a"]])))
    with pytest.raises(DatasetError, match="object arrays"):
        parse_dataset(npy(np.array([object()], dtype=object)))
    inf = x.copy()
    inf[1, 0, 0, 0] = np.inf
    with pytest.raises(DatasetError, match="1 queries contain NaN or infinity"):
        parse_dataset(npy(inf))


def test_datasets_take_table_rows_and_refuse_other_shapes() -> None:
    """A table task's records are (N, features); the student party checks the width."""
    rows = np.random.default_rng(0).random((7, 30))
    np.testing.assert_array_equal(parse_dataset(npy(rows)), rows.astype(np.float32))
    for shape in [(7,), (7, 1, 30), (0, 30), (7, 1, 2, 3, 4)]:
        with pytest.raises(DatasetError, match=r"\(N, features\) for a table task"):
            parse_dataset(npy(np.zeros(shape)))


def test_every_openapi_reference_resolves(tmp_path: Path) -> None:
    """A dangling $ref leaves part of a response untested by schemathesis and unusable by
    client generators."""
    app = create_app(
        Backends("127.0.0.1:1", "127.0.0.1:1", None), TokenStore(str(tmp_path / "t.db"))
    )
    spec = app.openapi()
    text = json.dumps(spec)
    refs = set(re.findall(r'"\$ref": "([^"]+)"', text))
    assert refs, "the spec has no references at all"
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in spec["components"]["schemas"], ref
