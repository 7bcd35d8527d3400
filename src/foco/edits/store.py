"""The ITT store: one SQLite file; every source caption's edits for one generator setting are written in one
transaction, keyed by (source id, settings id), so that a killed job loses nothing and a rerun writes nothing twice."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ..decompose.store import RUNS, open_store, read_runs, read_settings, record_run, register_settings, writing
from .schema import ITTRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (settings_id TEXT PRIMARY KEY, name TEXT NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (source_id TEXT NOT NULL, settings_id TEXT NOT NULL, n INTEGER NOT NULL,
                                    PRIMARY KEY (source_id, settings_id));
CREATE TABLE IF NOT EXISTS triplets (source_id TEXT NOT NULL, settings_id TEXT NOT NULL, i INTEGER NOT NULL,
                                     kind TEXT NOT NULL, record TEXT NOT NULL,
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
        return read_runs(self.db)

    def done_sources(self, sid: str) -> set[str]:
        return {s for (s,) in self.db.execute("SELECT source_id FROM sources WHERE settings_id = ?", (sid,))}

    def put_many(self, sid: str, per_source: Iterable[tuple[str, list[ITTRecord]]]) -> int:
        """Writes each source's records (possibly none: a caption no edit fits) in one transaction; returns how
        many sources were new."""
        new = 0
        with writing(self.db, self.path):
            for source_id, records in per_source:
                cur = self.db.execute("INSERT OR IGNORE INTO sources VALUES (?, ?, ?)", (source_id, sid, len(records)))
                if cur.rowcount:
                    new += 1
                    self.db.executemany("INSERT INTO triplets VALUES (?, ?, ?, ?, ?)",
                                        [(source_id, sid, i, r.kind, json.dumps(r.to_dict())) for i, r in
                                         enumerate(records)])
        return new

    def records(self, sid: str) -> list[ITTRecord]:
        rows = self.db.execute("SELECT record FROM triplets WHERE settings_id = ? ORDER BY rowid", (sid,))
        return [ITTRecord(**json.loads(r)) for (r,) in rows]

    def kinds(self, sid: str) -> dict[str, int]:
        return dict(self.db.execute("SELECT kind, COUNT(*) FROM triplets WHERE settings_id = ? GROUP BY kind "
                                    "ORDER BY kind", (sid,)).fetchall())

    def settings(self) -> dict[str, dict[str, Any]]:
        return read_settings(self.db)
