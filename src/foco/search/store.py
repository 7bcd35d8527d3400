"""The metadata of an image index: one SQLite row per indexed file (id, relative path, size, mtime, sha256, pixel
size, and the slot of its features in the on-disk arrays of `arrays.py`).

An index built from webdataset shards (`shards.py`) names each row `<shard name>#<key>` and keeps, in the
`samples` table, where the image's bytes lie in the tar and the sample's url and caption (img2dataset's metadata).

Ids are never reused (AUTOINCREMENT), so an id a client holds names the same file, or nothing, after any update.
Every batch of new rows is one transaction, written after its features are on disk, so a killed build keeps what
it finished and a rerun continues. The row count is kept in the same transactions (`state.count`), so a reader
gets a count and a page of rows from one snapshot (`snapshot`) without scanning 100M rows. The features
themselves never enter SQLite: 100M ViT-L/14 vectors are 307 GB.
"""
from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..decompose.store import check_row, open_store, reading, row_digest, writing
from .arrays import FeatureArrays

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    slot INTEGER NOT NULL UNIQUE,
    digest TEXT NOT NULL DEFAULT ''  -- row_digest of every other column, '' in rows from before
);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS removed (id INTEGER PRIMARY KEY);  -- ids to take out of the FAISS index at its next write
CREATE TABLE IF NOT EXISTS samples (  -- a shard-built index (`shards.py`): where each image lies in its tar shard
    id INTEGER PRIMARY KEY,
    offset INTEGER NOT NULL,  -- of the image member's bytes in the tar (its size is the row's size)
    url TEXT,
    caption TEXT
);
"""
_ROW = "id, path, size, mtime_ns, sha256, width, height, slot, digest"


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
    """INDEX/images.sqlite and the feature arrays beside it. `readonly`: the server's view, one SQLite connection
    per thread (no lock: a thumbnail never waits behind another request's query)."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path, self.readonly = Path(path), readonly
        self._local = threading.local()
        if readonly:
            if not self.path.is_file():
                raise FileNotFoundError(f"{self.path} is missing: rerun `foco index update` on this index")
            self._check_schema(self.db)
        else:
            self._writer = open_store(self.path, _SCHEMA, "image index store")
            self._check_schema(self._writer)
            if self._state("count") is None:  # an index written before the count was kept: counted once
                with writing(self.db, self.path):
                    self.db.execute("INSERT OR IGNORE INTO state VALUES ('count', (SELECT COUNT(*) FROM images))")
        self.vectors, self.patches = self._arrays()
        if not readonly and self.vectors is not None:  # rows past the committed end: a killed build's last batch
            n = self.next_slot()
            self.vectors.truncate(n)
            if self.patches is not None:
                self.patches.truncate(n)

    @property
    def db(self) -> sqlite3.Connection:
        if not self.readonly:
            return self._writer
        conn = getattr(self._local, "db", None)
        if conn is None:
            conn = self._local.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        return conn

    def _check_schema(self, db: sqlite3.Connection) -> None:
        with reading(self.path):
            cols = {r[1] for r in db.execute("PRAGMA table_info(images)")}
        self._cols = _ROW if "digest" in cols else _ROW.replace("digest", "''")  # a read-only index from before
        if "vector" in cols or "slot" not in cols:
            raise ValueError(f"{self.path} was written by an older foco (vectors inside SQLite); build the index "
                             "again with `foco index build` into a new --out")

    def close(self) -> None:
        if not self.readonly:
            self._writer.close()

    def __enter__(self) -> "ImageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- state ------------------------------------------------------------------------------------------------
    def _state(self, key: str) -> int | None:
        with reading(self.path):
            r = self.db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if r is None else int(r[0])

    def next_slot(self) -> int:
        return self._state("next_slot") or 0

    def dim(self) -> int | None:
        return self._state("dim")

    def _arrays(self) -> tuple[FeatureArrays | None, FeatureArrays | None]:
        dim, p = self._state("dim"), self._state("num_patches")
        if dim is None:
            return None, None
        folder = self.path.parent
        vectors = FeatureArrays(folder / "vectors", (dim,), "float32")
        return vectors, (FeatureArrays(folder / "patches", (p, dim), "float16") if p else None)

    def set_shapes(self, dim: int, num_patches: int | None) -> None:
        """The features' shapes, fixed by the first batch (num_patches None: no patch array)."""
        with writing(self.db, self.path):
            self.db.execute("INSERT OR IGNORE INTO state VALUES ('dim', ?)", (int(dim),))
            if num_patches:
                self.db.execute("INSERT OR IGNORE INTO state VALUES ('num_patches', ?)", (int(num_patches),))
        self.vectors, self.patches = self._arrays()
        if self.dim() != dim:
            raise ValueError(f"{self.path} holds {self.dim()}-d features; this backbone gives {dim}")

    # --- rows -------------------------------------------------------------------------------------------------
    def rows(self) -> dict[str, ImageRow]:
        """Every row by relative path (the walk's comparison; a folder's worth of small records)."""
        with reading(self.path):
            return {r[1]: self._checked(r) for r in self.db.execute(f"SELECT {self._cols} FROM images")}

    def _checked(self, r: tuple) -> ImageRow:
        """An `_ROW` row as an ImageRow, checked against the digest written with it."""
        check_row(self.path, r[8], r[:8], f"row of image id {r[0]}")
        return ImageRow(*r[:7])

    def row(self, image_id: int) -> ImageRow | None:
        with reading(self.path):
            r = self.db.execute(f"SELECT {self._cols} FROM images WHERE id = ?", (int(image_id),)).fetchone()
            return self._checked(r) if r else None

    def page(self, offset: int, limit: int) -> list[ImageRow]:
        with reading(self.path):
            cur = self.db.execute(f"SELECT {self._cols} FROM images ORDER BY id LIMIT ? OFFSET ?", (limit, offset))
            return [self._checked(r) for r in cur]

    def rows_by_id(self, ids) -> dict[int, ImageRow]:
        """The rows of `ids` that exist, by id (one query per 900 ids)."""
        ids = [int(i) for i in ids]
        out: dict[int, ImageRow] = {}
        for s in range(0, len(ids), 900):
            part = ids[s:s + 900]
            with reading(self.path):
                marks = ",".join("?" * len(part))
                cur = self.db.execute(f"SELECT {self._cols} FROM images WHERE id IN ({marks})", part)
                out.update({r[0]: self._checked(r) for r in cur})
        return out

    def count(self) -> int:
        n = self._state("count")
        return n if n is not None else self.db.execute("SELECT COUNT(*) FROM images").fetchone()[0]

    def snapshot(self, offset: int, limit: int) -> tuple[int, list[ImageRow]]:
        """(count, a page of rows in id order), read in one transaction: an update committing meanwhile changes
        both or neither."""
        db = self.db
        db.execute("BEGIN")
        try:
            return self.count(), self.page(offset, limit)
        finally:
            db.execute("COMMIT")

    def _add_count(self, delta: int) -> None:
        """In a writing transaction: the kept count moves with the rows."""
        self.db.execute("UPDATE state SET value = value + ? WHERE key = 'count'", (int(delta),))

    def add(self, rows: list[ImageRow], vectors: np.ndarray, patches: np.ndarray | None = None) -> list[int]:
        """Appends the features of `rows` (vectors (n, D) float32, patches (n, P, D) or None), then records the
        rows in one transaction; a path already present is replaced (a changed file gets a new id: the old id named
        other content). Returns the new ids, in order."""
        if not rows:
            return []
        if self.vectors is None:
            self.set_shapes(vectors.shape[1], None if patches is None else patches.shape[1])
        if (patches is None) != (self.patches is None):
            raise ValueError(f"{self.path}: this index {'stores' if self.patches is not None else 'does not store'} "
                             "patch features; update it with its own settings")
        first = self.next_slot()
        self.vectors.write(first, vectors)
        if patches is not None:
            self.patches.write(first, patches)
        ids, replaced = [], 0
        with writing(self.db, self.path):
            for k, row in enumerate(rows):
                old = self.db.execute("DELETE FROM images WHERE path = ? RETURNING id", (row.path,)).fetchone()
                if old is not None:
                    replaced += 1
                    self.db.execute("INSERT OR IGNORE INTO removed VALUES (?)", (old[0],))
                cur = self.db.execute("INSERT INTO images (path, size, mtime_ns, sha256, width, height, slot) "
                                      "VALUES (?, ?, ?, ?, ?, ?, ?)", (row.path, row.size, row.mtime_ns, row.sha256,
                                                                       row.width, row.height, first + k))
                ids.append(int(cur.lastrowid))
                self.db.execute("UPDATE images SET digest = ? WHERE id = ?", (row_digest(
                    ids[-1], row.path, row.size, row.mtime_ns, row.sha256, row.width, row.height, first + k), ids[-1]))
            self.db.execute("INSERT OR REPLACE INTO state VALUES ('next_slot', ?)", (first + len(rows),))
            self._add_count(len(rows) - replaced)
        return ids

    def append(self, rows: list[ImageRow], vectors: np.ndarray,
               samples: list[tuple[int, str | None, str | None]] | None = None) -> list[int]:
        """Appends new rows (paths not in the store) with their vectors (n, D) float32 in one transaction of batched
        inserts (`executemany`), with the next ids in order; `samples`: each row's (tar offset, url, caption), for
        a shard-built index. A path already present is refused (ValueError naming it): `add` replaces rows."""
        if not rows:
            return []
        if self.vectors is None:
            self.set_shapes(vectors.shape[1], None)
        if self.patches is not None:
            raise ValueError(f"{self.path}: this index stores patch features; update it with its own settings")
        first = self.next_slot()
        self.vectors.write(first, vectors)
        with writing(self.db, self.path):
            r = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'images'").fetchone()
            first_id = int(r[0] if r else 0) + 1
            values = [(first_id + k, row.path, row.size, row.mtime_ns, row.sha256, row.width, row.height, first + k)
                      for k, row in enumerate(rows)]
            try:
                self.db.executemany("INSERT INTO images (id, path, size, mtime_ns, sha256, width, height, slot, "
                                    "digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                    [(*v, row_digest(*v)) for v in values])
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"{self.path}: a row of this batch is indexed already ({exc}); build into a new "
                                 "--out") from None
            if samples is not None:
                self.db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)",
                                    [(first_id + k, *s) for k, s in enumerate(samples)])
            self.db.execute("INSERT OR REPLACE INTO state VALUES ('next_slot', ?)", (first + len(rows),))
            self._add_count(len(rows))
        return list(range(first_id, first_id + len(rows)))

    def paths_from(self, low: str, high: str) -> list[str]:
        """The indexed paths p with low <= p < high, in order (a shard's rows: its name + '#' .. + '$')."""
        with reading(self.path):
            cur = self.db.execute("SELECT path FROM images WHERE path >= ? AND path < ? ORDER BY path", (low, high))
            return [r[0] for r in cur]

    def samples(self, ids) -> dict[int, tuple[int, str | None, str | None]]:
        """(tar offset, url, caption) of the shard samples `ids` that have them (an index built from shards)."""
        ids = [int(i) for i in ids]
        out: dict[int, tuple[int, str | None, str | None]] = {}
        with reading(self.path):
            if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'samples'").fetchone():
                return out  # a read-only index from before the table
            for s in range(0, len(ids), 900):
                part = ids[s:s + 900]
                cur = self.db.execute(f"SELECT id, offset, url, caption FROM samples WHERE id IN "
                                      f"({','.join('?' * len(part))})", part)
                out.update({int(r[0]): (int(r[1]), r[2], r[3]) for r in cur})
        return out

    def touch(self, path: str, size: int, mtime_ns: int) -> None:
        """Records a new mtime for a file whose content (sha256) did not change."""
        with writing(self.db, self.path):
            r = self.db.execute(f"SELECT {self._cols} FROM images WHERE path = ?", (path,)).fetchone()
            if r is None:
                return
            self._checked(r)
            fields = (r[0], r[1], size, mtime_ns, *r[4:8])
            self.db.execute("UPDATE images SET size = ?, mtime_ns = ?, digest = ? WHERE path = ?",
                            (size, mtime_ns, row_digest(*fields) if r[8] else "", path))

    def remove(self, paths: list[str]) -> list[int]:
        """Drops the rows of `paths`; returns their ids."""
        ids = []
        with writing(self.db, self.path):
            for p in paths:
                r = self.db.execute("DELETE FROM images WHERE path = ? RETURNING id", (p,)).fetchone()
                if r is not None:
                    ids.append(int(r[0]))
                    self.db.execute("INSERT OR IGNORE INTO removed VALUES (?)", (r[0],))
            self._add_count(-len(ids))
        return ids

    def removed(self) -> list[int]:
        """Ids removed (or replaced) since the FAISS index was last written."""
        return [int(r[0]) for r in self.db.execute("SELECT id FROM removed ORDER BY id")]

    def clear_removed(self) -> None:
        with writing(self.db, self.path):
            self.db.execute("DELETE FROM removed")

    # --- features ---------------------------------------------------------------------------------------------
    def live(self, chunk: int = 65536, since_id: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, slots), each (n,) int64, of every row with id > since_id in id order, `chunk` rows at a time."""
        cur = self.db.execute("SELECT id, slot FROM images WHERE id > ? ORDER BY id", (since_id,))
        while True:
            part = cur.fetchmany(chunk)
            if not part:
                return
            a = np.asarray(part, dtype=np.int64)
            yield a[:, 0], a[:, 1]

    def slots(self, ids) -> np.ndarray:
        """Slots of `ids` (n,), -1 where an id is not in the index."""
        ids = [int(i) for i in ids]
        found: dict[int, int] = {}
        for s in range(0, len(ids), 900):  # SQLite's bound-parameter limit
            part = ids[s:s + 900]
            q = f"SELECT {self._cols} FROM images WHERE id IN ({','.join('?' * len(part))})"
            with reading(self.path):
                for r in self.db.execute(q, part):
                    found[self._checked(r).id] = r[7]
        return np.array([found.get(i, -1) for i in ids], dtype=np.int64)

    def vector_rows(self, ids) -> np.ndarray:
        """(n, D) float32 global features of `ids` (all indexed)."""
        slots = self.slots(ids)
        if (slots < 0).any():
            raise KeyError(f"id {int(np.asarray(ids)[slots < 0][0])} is not in the index")
        return self.vectors.read(slots)

    def patch_rows(self, image_id: int) -> np.ndarray | None:
        """(P, D) float32 patches of `image_id`, or None when the index stores none."""
        slot = self.slots([image_id])[0]
        if slot < 0 or self.patches is None:
            return None
        return self.patches.read([slot])[0].astype(np.float32)

    def feature_bytes(self) -> dict[str, int]:
        return {"vectors": self.vectors.nbytes() if self.vectors else 0,
                "patches": self.patches.nbytes() if self.patches else 0}
