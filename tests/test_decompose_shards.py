"""`foco decompose --shard i/n` and `foco decompose merge` (issue 15): three shards decomposed apart and merged give
the same store content as one run; merging again changes nothing; conflicts are refused; flags are kept."""
from __future__ import annotations

import sqlite3

import pytest

from foco.cli import main
from foco.decompose.run import parse_shard, shard_of
from foco.decompose.store import StoreError, merge_stores


def _rows(path):
    with sqlite3.connect(path) as db:
        return (sorted(db.execute("SELECT caption_hash, settings_id, caption, record, flag FROM decompositions")),
                sorted(db.execute("SELECT * FROM settings")))


@pytest.fixture
def captions(tmp_path):
    texts = [f"a {c} {s} on a {b} background" for c in ("red", "blue", "green") for s in ("circle", "star", "heart")
             for b in ("sand", "ocean", "forest")]
    path = tmp_path / "captions.csv"
    path.write_text("id,caption\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    return path, texts


def test_three_shards_merged_equal_one_run(captions, tmp_path, capsys):
    path, texts = captions
    base = ["decompose", "--in", str(path), "--decomposer", "rule"]
    assert main(base + ["--out", str(tmp_path / "one.sqlite")]) == 0
    for i in range(3):
        assert main(base + ["--out", str(tmp_path / f"s{i}.sqlite"), "--shard", f"{i}/3"]) == 0
    sizes = [len(_rows(tmp_path / f"s{i}.sqlite")[0]) for i in range(3)]
    assert sum(sizes) == len(texts) and all(sizes)  # a partition
    shards = [str(tmp_path / f"s{i}.sqlite") for i in range(3)]
    assert main(["decompose", "merge", "--out", str(tmp_path / "merged.sqlite"), *shards]) == 0
    assert _rows(tmp_path / "merged.sqlite") == _rows(tmp_path / "one.sqlite")
    assert main(["decompose", "merge", "--out", str(tmp_path / "merged.sqlite"), *shards]) == 0
    assert _rows(tmp_path / "merged.sqlite") == _rows(tmp_path / "one.sqlite")
    assert "0 rows added" in capsys.readouterr().out.splitlines()[-1]


def test_the_split_depends_on_the_caption_alone():
    assert [shard_of("a red circle", 4)] * 2 == [shard_of("a red circle", 4), shard_of("a red circle", 4)]
    assert parse_shard("2/5") == (2, 5)
    for bad in ("5/5", "-1/3", "1/0", "x"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_a_conflict_is_refused_and_flags_are_kept(captions, tmp_path):
    path, _ = captions
    base = ["decompose", "--in", str(path), "--decomposer", "rule"]
    assert main(base + ["--out", str(tmp_path / "a.sqlite")]) == 0
    assert main(base + ["--out", str(tmp_path / "b.sqlite")]) == 0
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        h = db.execute("SELECT caption_hash FROM decompositions LIMIT 1").fetchone()[0]
        db.execute("UPDATE decompositions SET flag = 'llm failed: timeout' WHERE caption_hash = ?", (h,))
    m = merge_stores([tmp_path / "b.sqlite"], tmp_path / "m.sqlite")
    assert m.flagged == 1
    with pytest.raises(StoreError, match="conflicts with .* on caption"):
        merge_stores([tmp_path / "a.sqlite"], tmp_path / "m.sqlite")


def _merge_in_memory(inputs, out):
    """The slow, obvious twin (the merge before issue 25): every row of the input and of the output in Python."""
    import json

    from foco.decompose.store import DecompositionStore, MergeStats, read_settings
    added = identical = 0
    with DecompositionStore(out) as dst:
        for path in inputs:
            with DecompositionStore(path) as src:
                settings = read_settings(src.db)
                rows = src.db.execute("SELECT caption_hash, settings_id, caption, record, flag, digest FROM "
                                      "decompositions").fetchall()
            have = {(h, s): (r, f) for h, s, r, f in dst.db.execute(
                "SELECT caption_hash, settings_id, record, flag FROM decompositions")}
            new = []
            for h, s, caption, record, flag, digest in rows:
                old = have.get((h, s))
                if old is None:
                    new.append((h, s, caption, record, flag, digest))
                elif old != (record, flag):
                    raise StoreError(f"conflict on {caption!r}")
                else:
                    identical += 1
            with dst.db:
                for sid, js in settings.items():
                    dst.db.execute("INSERT OR IGNORE INTO settings VALUES (?, ?, ?)",
                                   (sid, str(js.get("name", "?")), json.dumps(js, sort_keys=True)))
                dst.db.executemany("INSERT INTO decompositions VALUES (?, ?, ?, ?, ?, ?)", new)
            added += len(new)
        flagged = dst.db.execute("SELECT COUNT(*) FROM decompositions WHERE flag != ''").fetchone()[0]
        return MergeStats(len(inputs), len(read_settings(dst.db)), added, identical, flagged)


def _synthetic_store(path, rows, settings=("s1", "s2")):
    import json

    from foco.decompose.store import DecompositionStore, register_settings
    with DecompositionStore(path) as st:
        sids = [register_settings(st.db, {"name": n}) for n in settings]
        with st.db:
            st.db.executemany("INSERT INTO decompositions (caption_hash, settings_id, caption, record, flag) "
                              "VALUES (?, ?, ?, ?, ?)",
                              [(f"h{i:06d}", sids[i % len(sids)], f"caption {i}",
                                json.dumps({"caption": f"caption {i}", "pairs": []}), flag) for i, flag in rows])


def test_the_streaming_merge_equals_the_in_memory_merge(tmp_path):
    """Overlapping shards (identical rows in two inputs), flags, two settings, a rerun, and a conflicting input:
    the streaming merge gives the same stores and counts as the in-memory twin, and refuses the same input."""
    _synthetic_store(tmp_path / "a.sqlite", [(i, "") for i in range(0, 300)])
    _synthetic_store(tmp_path / "b.sqlite", [(i, "llm failed" if i % 7 == 0 else "") for i in range(250, 600)])
    _synthetic_store(tmp_path / "c.sqlite", [(i, "llm failed" if i % 7 == 0 and i < 600 else "")
                                             for i in range(590, 700)], settings=("s1", "s2", "s3"))
    with sqlite3.connect(tmp_path / "a.sqlite") as db:  # b flags some rows a holds unflagged: make those agree
        db.execute("UPDATE decompositions SET flag = 'llm failed' WHERE CAST(substr(caption_hash, 2) AS INT) % 7 = 0 "
                   "AND CAST(substr(caption_hash, 2) AS INT) >= 250")
    inputs = [tmp_path / n for n in ("a.sqlite", "b.sqlite", "c.sqlite")]
    for run in range(2):  # the second run changes nothing
        fast = merge_stores(inputs, tmp_path / "fast.sqlite")
        slow = _merge_in_memory(inputs, tmp_path / "slow.sqlite")
        assert fast == slow, (run, fast, slow)
        assert _rows(tmp_path / "fast.sqlite") == _rows(tmp_path / "slow.sqlite")
    assert (fast.added, fast.identical) == (0, 300 + 350 + 110)
    _synthetic_store(tmp_path / "bad.sqlite", [(i, "") for i in range(690, 720)], settings=("s1", "s2", "s3"))
    with sqlite3.connect(tmp_path / "bad.sqlite") as db:
        db.execute("UPDATE decompositions SET record = '{}' WHERE caption_hash = 'h000695'")
    before = _rows(tmp_path / "fast.sqlite")
    with pytest.raises(StoreError, match="caption 695"):
        merge_stores([tmp_path / "bad.sqlite"], tmp_path / "fast.sqlite")
    with pytest.raises(StoreError, match="caption 695"):
        _merge_in_memory([tmp_path / "bad.sqlite"], tmp_path / "slow.sqlite")
    assert _rows(tmp_path / "fast.sqlite") == before == _rows(tmp_path / "slow.sqlite")  # nothing of it merged
