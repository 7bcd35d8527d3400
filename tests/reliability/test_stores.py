"""Reliability (issue 13, finding 9): a store file never exists without its schema, so a reader that polls it
(the kill-and-restart test did, and failed on a loaded machine with "no such table") sees either no file or every
table."""
from __future__ import annotations

import sqlite3

import pytest

from foco.decompose import store as dstore
from foco.decompose.store import DecompositionStore, StoreError
from foco.edits.store import EditStore


@pytest.mark.parametrize("cls,table", [(DecompositionStore, "decompositions"), (EditStore, "triplets")])
def test_a_new_store_appears_with_its_schema(cls, table, tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    seen = []
    real = dstore.init_schema

    def spy(db, schema):  # while the schema is being written, the store's own name must not exist yet
        seen.append(path.exists())
        real(db, schema)

    monkeypatch.setattr(dstore, "init_schema", spy)
    with cls(path):
        pass
    assert seen[0] is False  # built under a temporary name
    with sqlite3.connect(path) as db:  # a fresh reader finds the table at once
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
    with cls(path):  # reopening an existing store keeps it
        pass


def test_a_file_that_is_no_store_is_refused_by_name(tmp_path):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("not a database, just text " * 100)
    with pytest.raises(StoreError, match="notes.sqlite"):
        DecompositionStore(bad)
