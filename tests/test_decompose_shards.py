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
