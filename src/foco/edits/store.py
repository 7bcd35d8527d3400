"""The ITT store: one SQLite file; every source caption's edits for one generator setting are written in one
transaction, keyed by (source id, settings id), so that a killed job loses nothing and a rerun writes nothing twice."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ..decompose.store import (RUNS, StoreError, check_row, open_store, read_runs, read_settings, reading, record_run,
                               register_settings, row_digest, writing)
from ..utils.io import loads_strict
from .schema import ITTRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (settings_id TEXT PRIMARY KEY, name TEXT NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (source_id TEXT NOT NULL, settings_id TEXT NOT NULL, n INTEGER NOT NULL,
                                    digest TEXT NOT NULL DEFAULT '', PRIMARY KEY (source_id, settings_id));
CREATE TABLE IF NOT EXISTS triplets (source_id TEXT NOT NULL, settings_id TEXT NOT NULL, i INTEGER NOT NULL,
                                     kind TEXT NOT NULL, record TEXT NOT NULL, digest TEXT NOT NULL DEFAULT '',
                                     PRIMARY KEY (source_id, settings_id, i));
""" + RUNS


class EditStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = open_store(self.path, _SCHEMA, "edit store")

    def __enter__(self) -> "EditStore":
        return self

    def __exit__(self, *exc) -> None:
        self.db.close()

    def register(self, settings: dict[str, Any]) -> str:
        with writing(self.db, self.path):
            return register_settings(self.db, settings)

    def record_run(self, sid: str, source: dict | None) -> None:
        record_run(self.db, self.path, sid, source)

    def runs(self) -> list[dict]:
        return read_runs(self.db, self.path)

    def done_sources(self, sid: str) -> set[str]:
        with reading(self.path):
            return {s for (s,) in self.db.execute("SELECT source_id FROM sources WHERE settings_id = ?", (sid,))}

    def put_many(self, sid: str, per_source: Iterable[tuple[str, list[ITTRecord]]]) -> int:
        """Writes each source's records (possibly none: a caption no edit fits) in one transaction; returns how
        many sources were new."""
        new = 0
        with writing(self.db, self.path):
            for source_id, records in per_source:
                cur = self.db.execute("INSERT OR IGNORE INTO sources (source_id, settings_id, n, digest) VALUES "
                                      "(?, ?, ?, ?)", (source_id, sid, len(records),
                                                       row_digest(source_id, sid, len(records))))
                if cur.rowcount:
                    new += 1
                    rows = [(source_id, sid, i, r.kind, json.dumps(r.to_dict())) for i, r in enumerate(records)]
                    self.db.executemany("INSERT INTO triplets (source_id, settings_id, i, kind, record, digest) "
                                        "VALUES (?, ?, ?, ?, ?, ?)", [(*r, row_digest(*r)) for r in rows])
        return new

    def records(self, sid: str) -> list[ITTRecord]:
        """The triplets of `sid` in the order they were written, each checked against its row digest, and every
        source's triplets all there (as many as its row in `sources` counts: none lost, none foreign)."""
        out = []
        with reading(self.path):
            counts = {}
            for source_id, n, digest in self.db.execute("SELECT source_id, n, digest FROM sources WHERE "
                                                        "settings_id = ?", (sid,)):
                check_row(self.path, digest, (source_id, sid, n), f"count of source {source_id}")
                counts[source_id] = n
            for source_id, i, kind, record, digest in self.db.execute(
                    "SELECT source_id, i, kind, record, digest FROM triplets WHERE settings_id = ? ORDER BY rowid",
                    (sid,)):
                check_row(self.path, digest, (source_id, sid, i, kind, record), f"triplet {i} of source {source_id}")
                fields = loads_strict(record)
                if not isinstance(fields, dict):
                    raise StoreError(f"{self.path}: triplet {i} of source {source_id} is not a record")
                out.append(ITTRecord(**fields))
        found: dict = {}
        for r in out:
            found[r.source_id] = found.get(r.source_id, 0) + 1
        wrong = next((s for s in set(found) | {s for s, n in counts.items() if n} if found.get(s, 0) != counts.get(s)),
                     None)
        if wrong is not None:
            raise StoreError(f"{self.path}: source {wrong} has {found.get(wrong, 0)} triplets of settings {sid}, but "
                             f"its row in `sources` counts {counts.get(wrong)}: the store is damaged; restore it from "
                             "a copy, or write it again into a new --out")
        return out

    def kinds(self, sid: str) -> dict[str, int]:
        with reading(self.path):
            return dict(self.db.execute("SELECT kind, COUNT(*) FROM triplets WHERE settings_id = ? GROUP BY kind "
                                        "ORDER BY kind", (sid,)).fetchall())

    def settings(self) -> dict[str, dict[str, Any]]:
        return read_settings(self.db, self.path)
