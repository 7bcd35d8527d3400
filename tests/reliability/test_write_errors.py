"""Issue 42 item 5 (the index): a full disk while `foco index build` writes its vectors or its FAISS index is an
error naming the file (never a traceback), and the rerun resumes to the index an uninterrupted build gives."""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from foco.cli import main


@pytest.fixture
def images(tiny_world, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for p in sorted((tiny_world / "images" / "test-single").glob("*.png"))[:5]:
        shutil.copy(p, folder / p.name)
    return folder


def _build(images, out):
    return main(["index", "build", "--images", str(images), "--backbone", "world:pretrained", "--out", str(out)])


def _count(out) -> int:
    import sqlite3
    with sqlite3.connect(out / "images.sqlite") as c:
        return c.execute("SELECT COUNT(*) FROM images").fetchone()[0]


@pytest.mark.parametrize("where", ["vectors", "faiss"])
def test_a_full_disk_during_index_build_names_the_file_and_the_rerun_finishes(where, images, tmp_path, monkeypatch,
                                                                            capsys):
    pytest.importorskip("faiss")
    import foco.search.arrays as arrays
    import foco.search.vectors as vectors
    if where == "vectors":
        def full(fd, data, offset):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(arrays.os, "pwrite", full)
    else:
        faiss = vectors._faiss()

        def full(index, path):
            raise RuntimeError("Error: 'ret == (size)' failed: write error")
        monkeypatch.setattr(faiss, "write_index", full)
    out = tmp_path / "idx"
    assert _build(images, out) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Traceback" not in err, err
    assert ("the disk is full" in err and "vectors" in err) if where == "vectors" else "vectors.faiss" in err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # nothing half-written left behind
    monkeypatch.undo()
    assert _build(images, out) == 0, capsys.readouterr().err
    assert _count(out) == 5
    from foco.search.engine import SearchEngine
    assert len(SearchEngine.open(out).search_vector(__import__("numpy").ones(256, "float32"), 5)) == 5


# --- issue 42 item 4: the text rule at every boundary, file names included -----------------------------------------

def test_a_jsonl_byte_that_is_not_utf8_is_refused_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "1", "caption": "a red square"}\n{"id": "2", "caption": "a bl\xffue circle"}\n')
    assert main(["decompose", "--in", str(path), "--decomposer", "rule", "--out", str(tmp_path / "d.sqlite")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not UTF-8 text (byte 0xff" in err and "iconv" in err, err
    assert not (tmp_path / "d.sqlite").exists()


def test_an_image_whose_name_is_not_utf8_is_skipped_and_listed_and_the_rerun_is_not_stuck(images, tmp_path, capsys):
    pytest.importorskip("faiss")
    bad = os.path.join(os.fsencode(images), b"b\xffd.png")
    shutil.copy(next(images.glob("*.png")), bad)
    out = tmp_path / "idx"
    for _ in range(2):  # the second build is an update: not stuck "building", nothing re-encoded
        assert _build(images, out) == 0, capsys.readouterr().err
        assert "1 skipped" in capsys.readouterr().out
        assert _count(out) == 5
        assert "b\\xffd.png\tits name is not valid UTF-8" in (out / "skipped.tsv").read_text()
    import json
    assert not json.loads((out / "index.json").read_text()).get("building")
