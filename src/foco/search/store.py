"""The metadata of an image index: one SQLite row per indexed file (id, relative path, size, mtime, sha256, pixel
size) with its global feature (and, with --with-patches, its patch features) as float32 / float16 blobs.

Ids are never reused (AUTOINCREMENT), so an id a client holds names the same file, or nothing, after any update.
Every batch of new rows is one transaction, so a killed build keeps what it finished and a rerun continues.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decompose.store import open_store, writing

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    vector BLOB NOT NULL,
    patches BLOB
);
"""


@dataclass
class ImageRow:
    id: int
    path: str  # relative to the indexed folder, with forward slashes
    size: int
    mtime_ns: int
    sha256: str
    width: int
    height: int


class ImageStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = open_store(self.path, _SCHEMA, "image index store")
        self.db.row_factory = None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "ImageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def rows(self) -> dict[str, ImageRow]:
        """Every row by relative path."""
        cur = self.db.execute("SELECT id, path, size, mtime_ns, sha256, width, height FROM images")
        return {r[1]: ImageRow(*r) for r in cur}

    def row(self, image_id: int) -> ImageRow | None:
        r = self.db.execute("SELECT id, path, size, mtime_ns, sha256, width, height FROM images WHERE id = ?",
                            (image_id,)).fetchone()
        return ImageRow(*r) if r else None

    def page(self, offset: int, limit: int) -> list[ImageRow]:
        cur = self.db.execute("SELECT id, path, size, mtime_ns, sha256, width, height FROM images ORDER BY id "
                              "LIMIT ? OFFSET ?", (limit, offset))
        return [ImageRow(*r) for r in cur]

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM images").fetchone()[0]

    def add(self, items: list[tuple[ImageRow, np.ndarray, np.ndarray | None]]) -> None:
        """Inserts (row without id, (D,) float32 vector, (P, D) patches or None) in one transaction; a path already
        present is replaced (a changed file gets a new id: the old id named other content)."""
        with writing(self.db, self.path):
            for row, vec, patches in items:
                self.db.execute("DELETE FROM images WHERE path = ?", (row.path,))
                self.db.execute("INSERT INTO images (path, size, mtime_ns, sha256, width, height, vector, patches) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (row.path, row.size, row.mtime_ns, row.sha256, row.width, row.height,
                                 np.asarray(vec, dtype=np.float32).tobytes(),
                                 None if patches is None else np.asarray(patches, dtype=np.float16).tobytes()))

    def touch(self, path: str, size: int, mtime_ns: int) -> None:
        """Records a new mtime for a file whose content (sha256) did not change."""
        with writing(self.db, self.path):
            self.db.execute("UPDATE images SET size = ?, mtime_ns = ? WHERE path = ?", (size, mtime_ns, path))

    def remove(self, paths: list[str]) -> None:
        with writing(self.db, self.path):
            self.db.executemany("DELETE FROM images WHERE path = ?", [(p,) for p in paths])

    def vectors(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(N,) int64 ids and (N, D) float32 vectors, in id order."""
        rows = self.db.execute("SELECT id, vector FROM images ORDER BY id").fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dim) if rows \
            else np.zeros((0, dim), dtype=np.float32)
        return ids, vecs

    def vector(self, image_id: int, dim: int) -> np.ndarray | None:
        r = self.db.execute("SELECT vector FROM images WHERE id = ?", (image_id,)).fetchone()
        return None if r is None else np.frombuffer(r[0], dtype=np.float32).reshape(dim)

    def patches(self, image_id: int, dim: int) -> np.ndarray | None:
        r = self.db.execute("SELECT patches FROM images WHERE id = ?", (image_id,)).fetchone()
        if r is None or r[0] is None:
            return None
        return np.frombuffer(r[0], dtype=np.float16).reshape(-1, dim).astype(np.float32)


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection (the server never writes the index)."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
