"""The decomposition store: one SQLite file, one row per (caption hash, decomposer settings).

Each batch of results is written in one transaction, so a job killed at any point leaves only whole rows, and
the primary key makes a second write of the same caption a no-op: restarted, a job finishes with every caption
stored exactly once. Several decomposers (or settings) can share one store; training picks one by name.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..utils.io import loads_strict
from .schema import Decomposition, caption_hash, settings_id

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (
    settings_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decompositions (
    caption_hash TEXT NOT NULL,
    settings_id TEXT NOT NULL REFERENCES settings(settings_id),
    caption TEXT NOT NULL,
    record TEXT NOT NULL,          -- Decomposition.to_dict() as JSON
    flag TEXT NOT NULL DEFAULT '', -- non-empty when a fallback produced the pairs
    digest TEXT NOT NULL DEFAULT '', -- row_digest of the other columns ('' in rows written before it)
    PRIMARY KEY (caption_hash, settings_id)
) WITHOUT ROWID;
""" + "\n" + "CREATE TABLE IF NOT EXISTS runs (settings_id TEXT NOT NULL, json TEXT NOT NULL);"
RUNS = "CREATE TABLE IF NOT EXISTS runs (settings_id TEXT NOT NULL, json TEXT NOT NULL);"  # every store kind's


def record_run(db: sqlite3.Connection, path: Path, sid: str, source: dict | None) -> None:
    """Appends what a run wrote its results from (the input file and its sha256, the count) and what made them
    (the command, the machine, foco's commit): the store's provenance, one row per run."""
    from ..utils.provenance import provenance
    with writing(db, path):
        db.execute("INSERT INTO runs VALUES (?, ?)", (sid, json.dumps({"source": source, **provenance()})))


def read_runs(db: sqlite3.Connection, path: Path | None = None) -> list[dict]:
    with reading(path or Path("the store")):
        runs = [{"settings_id": sid, **loads_strict(j)} for sid, j in db.execute("SELECT settings_id, json FROM runs")]
    for r in runs:
        if not isinstance(r.get("source", {}), (dict, type(None))):
            raise StoreError(f"{path}: a run's record is damaged (its source is not an object)")
    return runs


class StoreError(ValueError):
    pass


@contextlib.contextmanager
def writing(db: sqlite3.Connection, path: Path):
    """One transaction; a full disk or a read-only store rolls it back (SQLite keeps the store consistent) and is
    reported as a `WriteError` that names the store, not as a bare OperationalError."""
    from ..utils.io import WriteError
    try:
        with db:
            yield db
    except sqlite3.OperationalError as exc:
        msg = str(exc)
        if any(k in msg for k in ("disk is full", "readonly", "unable to open", "disk I/O error")):
            raise WriteError(f"cannot write {path}: {msg}; the transaction was rolled back and the store keeps "
                             "everything written before it. Free space or choose a writable --out, then rerun the "
                             "same command to resume") from exc
        raise


def open_store(path: Path, schema: str, what: str) -> sqlite3.Connection:
    """A connection to the SQLite store at `path`, which never exists without its schema: a new store is built
    under a temporary name (schema, WAL mode) and linked into place, so a reader polling `path` (a test, a second
    job) sees either no file or a store with every table. An existing store gets any missing table."""
    from ..utils.io import WriteError, unwritable_reason
    if not path.exists() and (why := unwritable_reason(path.parent)):
        raise WriteError(f"cannot create {path}: {why}; choose a writable --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with contextlib.closing(sqlite3.connect(tmp)) as db:
                init_schema(db, schema)
            try:
                os.link(tmp, path)  # fails if another job created the store meanwhile: theirs is kept
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        db = sqlite3.connect(path, timeout=60)
        _check_own(db, path, schema, what)
        init_schema(db, schema)
        return db
    except sqlite3.OperationalError as exc:
        if any(k in str(exc) for k in ("disk is full", "readonly", "unable to open", "disk I/O error")):
            raise WriteError(f"cannot create or open {path}: {exc}; choose a writable --out") from exc
        raise StoreError(f"{path} is not a foco {what}: {exc}") from exc
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is not a foco {what}, or is damaged: {exc}") from None
    except PermissionError as exc:
        raise WriteError(f"cannot create {path}: the folder is not writable; choose a writable --out") from exc


# Every kind of foco store and the tables only it holds (`settings` and `runs` are every kind's): a store of one
# kind is never given another kind's tables.
STORE_TABLES = {"decomposition store": {"decompositions"}, "edit store": {"sources", "triplets"},
                "image index store": {"images", "state", "removed"}}
SHARED_TABLES = {"settings", "runs"}


def _check_own(db: sqlite3.Connection, path: Path, schema: str, what: str) -> None:
    """An existing SQLite file is written into only when it is empty or a store of this kind (it holds one of the
    schema's own tables): another application's database, or a store of another kind (`STORE_TABLES`), is never
    given foco's tables, and the refusal says which it is."""
    import re
    have = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    mine = set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", schema)) - SHARED_TABLES
    other = next((kind for kind, tables in STORE_TABLES.items() if kind != what and have & tables), None)
    if other is not None:
        db.close()
        article = "an" if what[0] in "aeiou" else "a"
        raise StoreError(f"{path} is a foco {other}, not {article} {what}; choose another --out (nothing was written "
                         "to it)")
    if have - SHARED_TABLES and not have & mine:
        db.close()
        raise StoreError(f"{path} is not a foco {what}: it is a SQLite database with the tables "
                         f"{', '.join(sorted(have)[:5])}; choose another --out (nothing was written to it)")


def init_schema(db: sqlite3.Connection, schema: str) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    import re
    for table in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \([^;]*\bdigest TEXT", schema):
        if "digest" not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:  # a store from before
            db.execute(f"ALTER TABLE {table} ADD COLUMN digest TEXT NOT NULL DEFAULT ''")


def row_digest(*fields) -> str:
    """The content hash a store row carries beside its fields (16 hex digits of their sha256): a byte changed in
    the file (a damaged disk, an edit) is caught when the row is read, not used. SQLite checks its pages' structure
    only, never the bytes of a value."""
    h = hashlib.sha256()
    for f in fields:
        h.update(str(f).encode("utf-8", "surrogatepass") + b"\x1f")
    return h.hexdigest()[:16]


def check_row(path: Path, digest: str, fields: tuple, what: str) -> None:
    """Refuses a row whose fields no longer match the digest written with them (rows from before digests, '',
    are taken as they are)."""
    if digest and digest != row_digest(*fields):
        raise StoreError(f"{path}: the {what} is damaged (its content no longer matches the digest stored with it); "
                         "restore the store from a copy, or write it again into a new --out")


@contextlib.contextmanager
def reading(path: Path):
    """Reads of a store: a damaged file (a truncated or overwritten page, or text that is not UTF-8) is a
    StoreError naming it, not a raw sqlite3 error."""
    try:
        yield
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is damaged ({exc}); restore it from a copy, or write it again into a new "
                         "--out") from None
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{path} is damaged (a stored record does not read: {exc}); restore it from a copy, or "
                         "write it again into a new --out") from None


class DecompositionStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = open_store(self.path, _SCHEMA, "decomposition store")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "DecompositionStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def register(self, settings: dict[str, Any]) -> str:
        with writing(self.db, self.path):
            return register_settings(self.db, settings)

    def record_run(self, sid: str, source: dict | None) -> None:
        record_run(self.db, self.path, sid, source)

    def runs(self) -> list[dict]:
        return read_runs(self.db, self.path)

    def done_hashes(self, sid: str, include_flagged: bool = True) -> set[str]:
        """Captions stored for `sid`; without the flagged ones (a fallback wrote them) when `include_flagged` is
        False, so that `--retry-flagged` asks again for exactly those."""
        query = "SELECT caption_hash FROM decompositions WHERE settings_id = ?" + ("" if include_flagged else
                                                                                    " AND flag = ''")
        return {h for (h,) in self.db.execute(query, (sid,))}

    def put_many(self, sid: str, results: Iterable[Decomposition], replace_flagged: bool = False) -> int:
        """Writes a batch in one transaction; captions already stored are left as they are, except flagged rows
        when `replace_flagged` (a retry of what a fallback wrote). Returns rows written."""
        rows = [(caption_hash(d.caption), sid, d.caption, json.dumps(d.to_dict(), ensure_ascii=False), d.flag)
                for d in results]
        rows = [(*r, row_digest(*r)) for r in rows]
        with writing(self.db, self.path):
            before = self.db.total_changes
            if replace_flagged:
                self.db.executemany("DELETE FROM decompositions WHERE caption_hash = ? AND settings_id = ? "
                                    "AND flag != ''", [r[:2] for r in rows])
            self.db.executemany("INSERT OR IGNORE INTO decompositions (caption_hash, settings_id, caption, record, "
                                "flag, digest) VALUES (?, ?, ?, ?, ?, ?)", rows)
            return (self.db.total_changes - before) if not replace_flagged else len(rows)

    def count(self, sid: str | None = None) -> int:
        if sid is None:
            return self.db.execute("SELECT COUNT(*) FROM decompositions").fetchone()[0]
        return self.db.execute("SELECT COUNT(*) FROM decompositions WHERE settings_id = ?", (sid,)).fetchone()[0]

    def flagged(self, sid: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM decompositions WHERE settings_id = ? AND flag != ''",
                               (sid,)).fetchone()[0]

    def settings(self) -> dict[str, dict[str, Any]]:
        return read_settings(self.db, self.path)

    def resolve(self, name: str) -> str:
        """The settings id of the one decomposer called `name` in this store (an id is accepted as is)."""
        known = self.settings()
        if name in known:
            return name
        matches = [sid for sid, s in known.items() if s.get("name") == name]
        if len(matches) == 1:
            return matches[0]
        listing = ", ".join(f"{sid} ({s.get('name')})" for sid, s in known.items()) or "none"
        if not matches:
            raise StoreError(f"{self.path} holds no '{name}' decompositions; it holds: {listing}")
        raise StoreError(f"{self.path} holds {len(matches)} '{name}' settings; pass one of these ids: {listing}")

    def get_many(self, sid: str, captions: list[str]) -> dict[str, Decomposition]:
        """caption -> Decomposition for every caption; raises StoreError naming how many are missing."""
        wanted = {caption_hash(c): c for c in captions}
        found: dict[str, Decomposition] = {}
        hashes = list(wanted)
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            q = f"SELECT caption_hash, caption, record, flag, digest FROM decompositions WHERE settings_id = ? AND " \
                f"caption_hash IN ({','.join('?' * len(part))})"
            with reading(self.path):
                for h, caption, record, flag, digest in self.db.execute(q, (sid, *part)):
                    check_row(self.path, digest, (h, sid, caption, record, flag), f"decomposition of {caption[:40]!r}")
                    if h not in wanted or caption != wanted[h]:
                        raise StoreError(f"{self.path}: the row of caption hash {h} holds another caption; the store "
                                         "is damaged")
                    found[wanted[h]] = Decomposition.from_dict(loads_strict(record))
        missing = [c for c in wanted.values() if c not in found]
        if missing:
            raise StoreError(f"{len(missing)} of {len(wanted)} captions have no decomposition with settings {sid} "
                             f"in {self.path} (e.g. {missing[0]!r}); run `foco decompose` on them first")
        return found


def register_settings(db: sqlite3.Connection, settings: dict[str, Any]) -> str:
    """Records a job's settings in a store's `settings` table (once) and returns their id."""
    sid = settings_id(settings)
    with db:
        db.execute("INSERT OR IGNORE INTO settings VALUES (?, ?, ?)",
                   (sid, str(settings.get("name", "?")), json.dumps(settings, sort_keys=True)))
    return sid


def read_settings(db: sqlite3.Connection, path: Path | None = None) -> dict[str, dict[str, Any]]:
    """settings id -> settings of every job recorded in a store, each checked against its id (the id is the hash
    of the settings: a changed byte in either is caught)."""
    with reading(path or Path("the store")):
        known = {sid: loads_strict(js) for sid, js in db.execute("SELECT settings_id, json FROM settings")}
    for sid, s in known.items():
        if not isinstance(s, dict) or settings_id(s) != sid:
            raise StoreError(f"{path or 'the store'}: the settings recorded under id {sid} no longer hash to it: the "
                             "store is damaged; restore it from a copy, or write it again into a new --out")
    return known


@dataclass
class MergeStats:
    stores: int
    settings: int
    added: int  # rows new to the output
    identical: int  # rows the output already held, the same
    flagged: int  # flagged rows in the output after the merge


def merge_stores(inputs: list[str | Path], out: str | Path) -> MergeStats:
    """Merges decomposition stores (e.g. the shards of `foco decompose --shard i/n`) into `out`, in one
    transaction per input. Settings are copied by id (an id is the hash of its settings, so the same id is the
    same settings). A caption stored under the same settings with another decomposition or another flag in two
    inputs is a conflict: nothing of that input is merged and the error names the caption. Rows already in `out`
    unchanged are left as they are, so merging twice changes nothing.

    Streaming: each input is attached to the output's connection and merged by SQL (a join on the primary key for
    the conflicts, `INSERT ... WHERE NOT EXISTS` for the new rows), so SQLite walks both tables page by page and
    Python holds no row; the memory stays SQLite's page cache whatever the stores' sizes."""
    out = Path(out)
    added = identical = 0
    with DecompositionStore(out) as dst:
        db = dst.db
        for path in inputs:
            path = Path(path)
            if path.resolve() == out.resolve():
                raise ValueError(f"{path} is the output store; give the inputs and the --out separately")
            if not path.is_file():
                raise FileNotFoundError(f"no store at {path}")
            DecompositionStore(path).close()  # refuses a file that is not a decomposition store
            db.execute("ATTACH DATABASE ? AS src", (str(path),))
            try:
                with writing(db, out):
                    # A plain BEGIN, whose first statement writes to the output: the output is locked before the
                    # check, and the input is only read (a shard still being written is not blocked).
                    db.execute("BEGIN")
                    db.execute("INSERT OR IGNORE INTO main.settings SELECT settings_id, name, json FROM src.settings")
                    src_digest = "s.digest" if "digest" in {r[1] for r in db.execute(
                        "PRAGMA src.table_info(decompositions)")} else "''"  # a store from before row digests
                    clash = db.execute(
                        "SELECT s.caption, s.settings_id FROM src.decompositions AS s JOIN main.decompositions AS d "
                        "ON d.caption_hash = s.caption_hash AND d.settings_id = s.settings_id "
                        "WHERE d.record != s.record OR d.flag != s.flag LIMIT 1").fetchone()
                    if clash is not None:
                        raise StoreError(f"{path} conflicts with {out} on caption {clash[0]!r} (settings {clash[1]}): "
                                         "another decomposition or flag; merge stores of one run, or retry the "
                                         "flagged rows first (foco decompose --retry-flagged)")
                    identical += db.execute(
                        "SELECT COUNT(*) FROM src.decompositions AS s JOIN main.decompositions AS d "
                        "ON d.caption_hash = s.caption_hash AND d.settings_id = s.settings_id").fetchone()[0]
                    before = db.total_changes
                    db.execute("INSERT INTO main.decompositions (caption_hash, settings_id, caption, record, flag, "
                               "digest) SELECT s.caption_hash, s.settings_id, s.caption, s.record, s.flag, "
                               f"{src_digest} FROM src.decompositions AS s WHERE NOT EXISTS (SELECT 1 FROM "
                               "main.decompositions AS d WHERE d.caption_hash = s.caption_hash "
                               "AND d.settings_id = s.settings_id)")
                    added += db.total_changes - before
            finally:
                db.execute("DETACH DATABASE src")
        n_settings = len(read_settings(db))
        flagged = db.execute("SELECT COUNT(*) FROM decompositions WHERE flag != ''").fetchone()[0]
    return MergeStats(len(inputs), n_settings, added, identical, flagged)


def stored_decompositions(items: list[tuple[str, str]], store: str | Path, decomposer: str, max_fallback: float,
                          what: str = "") -> dict:
    """(id, caption) items -> {id: Decomposition} from `store` under `decomposer` (a name or settings id).

    Rows a fallback wrote (flagged: the LLM failed and the rule decomposer answered) are counted: more than
    `max_fallback` of the captions is refused, so that "llm" never trains on rule pairs without a word; fewer are
    logged."""
    import logging
    if not Path(store).is_file():
        raise FileNotFoundError(f"decomposition store not found: {store} (run `foco decompose --out {store}`)")
    with DecompositionStore(store) as s:
        found = s.get_many(s.resolve(decomposer), [c for _, c in items])
    flagged = sum(1 for _, c in items if found[c].flag)
    refuse_fallbacks(flagged, len(items), store, decomposer, max_fallback, what)
    if flagged:
        logging.getLogger(__name__).warning("%d of %d %scaptions in %s (%s) were written by a fallback", flagged,
                                            len(items), what, store, decomposer)
    return {i: found[c] for i, c in items}


def check_fallback_share(store: str | Path, decomposer: str, max_fallback: float) -> None:
    """The rule of `stored_decompositions` over a whole store, from its counts alone (for a corpus read one shard
    at a time): more than `max_fallback` of the rows written by a fallback is refused."""
    if not Path(store).is_file():
        raise FileNotFoundError(f"decomposition store not found: {store} (run `foco decompose --out {store}`)")
    with DecompositionStore(store) as s:
        sid = s.resolve(decomposer)
        flagged, total = s.flagged(sid), s.count(sid)
    refuse_fallbacks(flagged, total, store, decomposer, max_fallback)


def refuse_fallbacks(flagged: int, total: int, store, decomposer: str, max_fallback: float, what: str = "") -> None:
    """The rule of every reader of a store: more than `max_fallback` of `total` captions written by a fallback is
    refused, naming the flags that fix it."""
    if flagged > max_fallback * total:
        raise ValueError(f"{flagged} of {total} {what}captions in {store} ({decomposer}) were written by a fallback, "
                         f"more than --max-fallback {max_fallback:g}: ask again with `foco decompose ... "
                         "--retry-flagged`, or raise --max-fallback")

