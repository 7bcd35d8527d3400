"""Issue 42 item 8: an artifact fuzzer. For every kind of artifact foco writes (a world, a feature cache, a FoCo
checkpoint, a search index, a decomposition store, an edit store) it damages one file of a clean copy (truncation,
a flipped byte, a field set to another type, NaN, a huge or a negative number, lines reordered or duplicated, the file
swapped with another artifact's) and runs the artifact's consumer on it. The consumer must either refuse with a
foco error that names the damaged file (or its folder), or give exactly the clean result: never a traceback of
another type, never a silently different result.

hypothesis, derandomised (every run draws the same cases: no flakiness), bounded per kind (`EXAMPLES`). With
FOCO_FUZZ_REPORT=FILE the outcomes by kind and damage class are written to FILE (docs/benchmarks.md's table)."""
from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = {"world": 250, "feature cache": 250, "FoCo checkpoint": 250, "search index": 150, "decomposition store": 250,
            "edit store": 250}
CLASSES = ("truncation", "flipped byte", "another type", "NaN", "huge", "negative", "lines reordered",
           "line duplicated", "swapped")
TALLY: dict = {}


# --- the artifacts: a clean one, a partner of the same kind to swap files with, and each kind's consumer ----------

class Kind:
    """An artifact kind: `files` (relative paths that may be damaged), `consume(folder)` (a comparable result)."""

    def __init__(self, name, clean: Path, partner: Path, files: list[str], consume):
        self.name, self.clean, self.partner, self.files, self.consume = name, clean, partner, files, consume
        self.expected = consume(clean)


def _world_kind(world: Path, tmp: Path) -> Kind:
    from foco.world.manifest import load_benchmark, load_pairs
    files = ["world.json", "pairs/train.jsonl", "benchmarks/test/single/queries.jsonl",
             "benchmarks/test/single/gallery.jsonl"]
    clean, partner = tmp / "world", tmp / "world-partner"
    for folder, source in ((clean, files), (partner, None)):
        for rel in files:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(world / rel, folder / rel)
    # the partner: the val split's files under the test names (another split of the same world), a world.json
    # of another world (the counts and hashes of the val files)
    for rel, other in (("benchmarks/test/single/queries.jsonl", "benchmarks/val/single/queries.jsonl"),
                       ("benchmarks/test/single/gallery.jsonl", "benchmarks/val/single/gallery.jsonl"),
                       ("pairs/train.jsonl", "pairs/backbone_val.jsonl")):
        shutil.copy(world / other, partner / rel)
    summary = json.loads((world / "world.json").read_text())
    summary["config"]["seed"] = 1
    (partner / "world.json").write_text(json.dumps(summary, indent=2))

    def consume(root: Path):
        pairs = load_pairs(root, "train")
        bench = load_benchmark(root, "test", "single")
        return ([(p.id, p.image.relative_to(root), p.caption, p.decomposition.to_dict()) for p in pairs],
                (bench.gallery_ids, [p.relative_to(root) for p in bench.gallery_images], bench.query_ids,
                 bench.references, bench.modifications, bench.targets, bench.subsets, bench.edit_types))
    return Kind("world", clean, partner, files, consume)


def _cache_kind(eval_features: Path, tmp: Path) -> Kind:
    from foco.features import FeatureCache
    clean, partner = tmp / "cache", tmp / "cache-partner"
    shutil.copytree(eval_features / "test-single", clean)
    shutil.copytree(eval_features / "test-multi", partner)
    files = ["manifest.json", "images/shard-00000.json", "images/shard-00000.safetensors", "texts/shard-00000.json",
             "texts/shard-00000.safetensors"]

    def consume(folder: Path):
        cache = FeatureCache(folder)
        ids, images = cache.images()
        text_ids, texts = cache.texts()
        return ids, images.global_, images.patches, text_ids, texts.global_
    return Kind("feature cache", clean, partner, files, consume)


def _checkpoint_kind(tmp: Path) -> Kind:
    from foco.methods import MethodOptions
    from foco.methods.provenance import check_trained_on
    from foco.model import ComposedQueryEncoder, FoCoConfig
    spec = "world:pretrained"
    torch.manual_seed(0)
    train = {"stage1_epochs": 1, "stage2_epochs": 1, "stage3_epochs": 0, "seed": 0}
    record = {"backbone": spec, "train": train, "provenance": {"backbone": {"spec": spec}}}  # as `foco train` writes
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp / "ckpt", record)
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp / "ckpt-partner", record)

    def consume(folder: Path):
        check_trained_on(MethodOptions(checkpoint=folder), {"spec": spec}, "the features", "use other features")
        model = ComposedQueryEncoder.load(folder)
        return repr(model.cfg), model.state_dict()
    return Kind("FoCo checkpoint", tmp / "ckpt", tmp / "ckpt-partner", ["foco.json", "foco.safetensors"], consume)


def _index_kind(tiny_world: Path, four_image_index: Path, tmp: Path) -> Kind:
    import threading
    from foco.backbones import create_backbone
    from foco.search.build import IndexConfig, build_index
    from foco.search.engine import Query, SearchEngine
    clean, partner = tmp / "index", tmp / "index-partner"
    shutil.copytree(four_image_index, clean)
    (tmp / "imgs").mkdir()
    for p in sorted((tiny_world / "images").rglob("*.png"))[4:8]:
        shutil.copy(p, tmp / "imgs" / p.name)
    build_index(IndexConfig(images=str(tmp / "imgs"), backbone="world:pretrained"), partner)
    backbones = {"world:pretrained": (create_backbone("world:pretrained"), threading.RLock())}

    def consume(folder: Path):
        engine = SearchEngine.open(folder, backbones=backbones)
        try:
            answer = engine.search(Query(text="make it red", reference=1, method="sum", k=4))
            return [(h.id, h.path, round(h.score, 5)) for h in answer.hits], engine.count()
        finally:
            engine.store.close()
    return Kind("search index", clean, partner, ["index.json", "images.sqlite", "vectors.faiss",
                                                 "vectors/shard-00000.f32"], consume)


def _decomposition_kind(tiny_world: Path, tmp: Path) -> Kind:
    from foco.decompose import build_decomposer
    from foco.decompose.inputs import read_captions
    from foco.decompose.run import run_decompose
    from foco.decompose.store import DecompositionStore
    captions = [r.caption for r in read_captions(tiny_world, split="train")]
    run_decompose(captions[:30], build_decomposer("rule"), tmp / "d.sqlite", show_progress=False)
    run_decompose(captions[30:60], build_decomposer("rule"), tmp / "d-partner.sqlite", show_progress=False)
    for path in (tmp / "d.sqlite", tmp / "d-partner.sqlite"):  # as a finished job leaves it: no WAL beside it
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (tmp / "dec").mkdir()
    (tmp / "dec-partner").mkdir()
    shutil.move(tmp / "d.sqlite", tmp / "dec" / "store.sqlite")
    shutil.move(tmp / "d-partner.sqlite", tmp / "dec-partner" / "store.sqlite")

    def consume(folder: Path):
        with DecompositionStore(folder / "store.sqlite") as store:
            found = store.get_many(store.resolve("rule"), captions[:30])
        return {c: d.to_dict() for c, d in found.items()}
    return Kind("decomposition store", tmp / "dec", tmp / "dec-partner", ["store.sqlite"], consume)


def _edit_kind(tiny_world: Path, tmp: Path) -> Kind:
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.train.sources import edit_records
    from foco.world.generate import world_fingerprint
    sources = [(r.id, r.truth) for r in read_captions(tiny_world, split="train")]
    world = world_fingerprint(tiny_world)
    # the partner: a store written from another world (of the same ids), which training must not take
    for name, made_from in (("edits", world), ("edits-partner", "0123456789abcdef")):
        (tmp / name).mkdir()
        run_generate(sources[:25], RuleWriter(), tmp / name / "store.sqlite", GenerateConfig(per_caption=2),
                     source={"world": made_from})
        with sqlite3.connect(tmp / name / "store.sqlite") as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def consume(folder: Path):
        return [r.to_dict() for r in edit_records(folder / "store.sqlite", world=world)]
    return Kind("edit store", tmp / "edits", tmp / "edits-partner", ["store.sqlite"], consume)


@pytest.fixture(scope="module")
def kinds(tiny_world, small_world, eval_features, four_image_index, tmp_path_factory) -> dict[str, Kind]:
    tmp = tmp_path_factory.mktemp("artifact-fuzz")
    # the world kind reads every pair and query of its files for each damage: the 192-pair world's
    return {k.name: k for k in (_world_kind(small_world, tmp), _cache_kind(eval_features, tmp),
                                _checkpoint_kind(tmp), _index_kind(tiny_world, four_image_index, tmp),
                                _decomposition_kind(tiny_world, tmp), _edit_kind(tiny_world, tmp))}


# --- the damage ------------------------------------------------------------------------------------------------

def _leaves(value, path=()):
    """Every (path, value) of a JSON value's scalars and containers below the top."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k), v
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):
            yield (*path, i), v
            yield from _leaves(v, (*path, i))


def _set(value, path, new):
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _replacement(damage: str, old, draw):
    if damage == "NaN":
        return math.nan
    if damage == "huge":
        return draw(st.sampled_from([1e308, 10 ** 30, 2 ** 63, -1e308, 1e300]))
    if damage == "negative":
        if isinstance(old, bool) or not isinstance(old, (int, float)):
            return draw(st.sampled_from([-1, -1.5, -(10 ** 9)]))
        return -old if old else -1
    # another type: a value of a type the field does not hold
    choices = [None, True, "x", [], {}, 7, 2.5]
    return draw(st.sampled_from([c for c in choices if type(c) is not type(old)]))


def _damage_json_text(text: str, damage: str, draw, jsonl: bool) -> str:
    """A record file (JSON, or JSON lines when `jsonl`) with one field damaged."""
    if jsonl:
        lines = text.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        rec = json.loads(lines[i])
        leaves = list(_leaves(rec))
        path, old = draw(st.sampled_from(leaves))
        _set(rec, path, _replacement(damage, old, draw))
        lines[i] = json.dumps(rec) + "\n"
        return "".join(lines)
    rec = json.loads(text)
    leaves = list(_leaves(rec))
    path, old = draw(st.sampled_from(leaves))
    _set(rec, path, _replacement(damage, old, draw))
    return json.dumps(rec, indent=2)


def _damage_sqlite(path: Path, damage: str, draw) -> None:
    """A value of a random row of a random table, set to another type, NaN, huge or negative (by SQL: the file
    stays a valid database, only a value is wrong)."""
    with sqlite3.connect(path) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                           "'sqlite_%'") if db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]]
        table = draw(st.sampled_from(sorted(tables)))
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        col = draw(st.sampled_from(cols))
        n = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        row = db.execute(f"SELECT {', '.join(cols)} FROM {table} LIMIT 1 OFFSET ?",
                         (draw(st.integers(0, n - 1)),)).fetchone()  # by value: some tables have no rowid
        old = row[cols.index(col)]
        new = _replacement(damage, old, draw)
        if isinstance(new, (list, dict)):
            new = json.dumps(new)
        if isinstance(new, int) and not -2 ** 63 <= new < 2 ** 63:  # SQLite's integers are 64-bit: the float
            new = float(new)
        try:
            db.execute(f"UPDATE {table} SET {col} = ? WHERE {' AND '.join(f'{c} IS ?' for c in cols)}", (new, *row))
        except sqlite3.IntegrityError:  # the schema refuses the value (NOT NULL, UNIQUE): nothing damaged
            pass
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _applicable(rel: str) -> list[str]:
    if rel.endswith((".json", ".jsonl")):
        return list(CLASSES)
    if rel.endswith(".sqlite"):
        return ["truncation", "flipped byte", "another type", "NaN", "huge", "negative", "swapped"]
    return ["truncation", "flipped byte", "swapped"]


def damage_file(kind: Kind, folder: Path, draw) -> tuple[str, str]:
    """Damages one file of `folder` (a copy of `kind.clean`); returns (relative path, damage class)."""
    rel = draw(st.sampled_from(kind.files))
    damage = draw(st.sampled_from(_applicable(rel)))
    path = folder / rel
    data = path.read_bytes()
    if damage == "truncation":
        path.write_bytes(data[:draw(st.integers(0, max(len(data) - 1, 0)))])
    elif damage == "flipped byte":
        at = draw(st.integers(0, len(data) - 1))
        path.write_bytes(data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:])
    elif damage == "swapped":
        shutil.copy(kind.partner / rel, path)
    elif damage in ("lines reordered", "line duplicated"):
        lines = data.decode().splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        if damage == "line duplicated":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        path.write_text("".join(lines))
    elif rel.endswith(".sqlite"):
        _damage_sqlite(path, damage, draw)
    else:
        path.write_text(_damage_json_text(data.decode(), damage, draw, rel.endswith(".jsonl")))
    return rel, damage


# --- the property --------------------------------------------------------------------------------------------------

def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _outcome(kind: Kind, folder: Path, rel: str, damage: str) -> str:
    """"refused" or "clean"; fails the test on a traceback of another type, an unnamed file, or a silent change."""
    from foco.decompose.store import StoreError
    try:
        got = kind.consume(folder)
    except (ValueError, OSError, KeyError) as exc:  # foco's errors: ManifestError, StoreError, RecordError, ...
        message = str(exc)
        named = Path(rel).name in message or str((folder / rel).parent) in message
        assert named and not type(exc).__module__.startswith(("json", "sqlite3", "safetensors")), (
            f"{kind.name}: {damage} of {rel} refused without naming it: {type(exc).__name__}: {message}")
        assert type(exc) is not KeyError or isinstance(exc, StoreError), (
            f"{kind.name}: {damage} of {rel}: a bare KeyError: {message}")
        return "refused"
    assert _same(got, kind.expected), f"{kind.name}: {damage} of {rel} gave a silently different result"
    return "clean"


@pytest.mark.slow  # 1,400 fuzzed artifacts and a module fixture of every kind: about 35 s (issue 53)
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_damaged_artifact_is_refused_by_name_or_read_exactly(kinds, name):
    kind = kinds[name]

    @settings(max_examples=EXAMPLES[name], derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        folder = Path(tempfile.mkdtemp(prefix="fuzz-")) / "a"
        try:
            shutil.copytree(kind.clean, folder, symlinks=True)
            rel, damage = damage_file(kind, folder, data.draw)
            outcome = _outcome(kind, folder, rel, damage)
            TALLY.setdefault(name, {}).setdefault(damage, {}).setdefault(outcome, 0)
            TALLY[name][damage][outcome] += 1
        finally:
            shutil.rmtree(folder.parent, ignore_errors=True)
    run()
    report = os.environ.get("FOCO_FUZZ_REPORT")
    if report:
        have = json.loads(Path(report).read_text()) if Path(report).is_file() else {}
        Path(report).write_text(json.dumps({**have, name: TALLY.get(name, {})}, indent=1, sort_keys=True))
