"""`foco index build | update` and `foco search`: FAISS against the exact index, incremental updates that touch
only what changed, skipped files listed, EXIF orientation, and the command line."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("faiss")

from foco.cli import main  # noqa: E402
from foco.index import ExactIndex  # noqa: E402
from foco.search.build import IndexConfig, build_index, update_index  # noqa: E402
from foco.search.vectors import build_vector_index, search_vectors  # noqa: E402


def test_faiss_flat_ranks_as_the_exact_index():
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((3000, 64)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    queries = rng.standard_normal((50, 64)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ids = np.arange(3000, dtype=np.int64) * 7 + 3  # ids are not row numbers
    scores, got = search_vectors(build_vector_index(ids, vecs, "Flat"), queries, 20)
    exact = ExactIndex(64)
    exact.add(torch.from_numpy(vecs))
    want_s, want_i = exact.search(torch.from_numpy(queries), 20)
    assert np.array_equal(got, ids[want_i.numpy()])
    assert np.allclose(scores, want_s.numpy(), atol=1e-5)


def test_a_bad_factory_string_names_the_flag():
    with pytest.raises(ValueError, match="--index-type 'IVFX' is not a FAISS index-factory string"):
        build_vector_index(np.arange(10), np.eye(10, 8, dtype=np.float32), "IVFX")
    with pytest.raises(ValueError, match="cannot be trained on 10 vectors.*Flat"):
        build_vector_index(np.arange(10), np.eye(10, 8, dtype=np.float32), "IVF64,Flat")


@pytest.fixture
def folder(tiny_world, tmp_path):
    """A copy of the tiny world's test gallery in nested folders, with a corrupt file and a non-image."""
    src = sorted((tiny_world / "images" / "test-single").glob("*.png"))[:40]
    root = tmp_path / "photos"
    for i, p in enumerate(src):
        d = root / ("a" if i % 2 else "b/c")
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, d / p.name)
    (root / "broken.png").write_bytes(src[0].read_bytes()[:100])
    (root / "notes.txt").write_text("not an image")
    return root


def _cfg(root, **kw):
    return IndexConfig(images=str(root), backbone="world:pretrained", **kw)


def test_build_lists_skips_and_update_touches_only_what_changed(folder, tmp_path):
    out = tmp_path / "index"
    stats = build_index(_cfg(folder), out)
    assert stats.indexed == 40 and stats.encoded == 40 and stats.skipped == 1
    assert "broken.png\tunreadable image" in (out / "skipped.tsv").read_text()
    assert json.loads((out / "index.json").read_text())["count"] == 40

    files = sorted(folder.rglob("test-*.png"))
    for p in files[:5]:
        p.unlink()
    new_dir = folder / "new"
    new_dir.mkdir()
    for i in range(10):
        im = Image.new("RGB", (64, 64), (20 * i, 100, 200 - 10 * i))
        im.save(new_dir / f"n{i}.png")
    same = files[10]
    os.utime(same, ns=(same.stat().st_atime_ns, same.stat().st_mtime_ns + 10 ** 9))  # mtime only
    changed = files[11]
    Image.new("RGB", (64, 64), "red").save(changed)
    stats = update_index(out)
    assert (stats.encoded, stats.removed, stats.touched, stats.skipped) == (11, 5, 1, 1), stats
    assert stats.unchanged == 40 - 5 - 2 and stats.indexed == 40 - 5 + 10
    assert update_index(out).encoded == 0  # nothing left to do


def test_exif_orientation_is_applied(tmp_path):
    from foco.search.build import open_image
    im = Image.new("RGB", (40, 20), "blue")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees to display
    im.save(tmp_path / "r.jpg", exif=exif)
    assert open_image(tmp_path / "r.jpg").size == (20, 40)


def test_search_cli_table_and_json(folder, tmp_path, capsys):
    out = tmp_path / "index"
    assert main(["index", "build", "--images", str(folder), "--backbone", "world:pretrained", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(out), "--reference", "1", "--text", "make the circle red",
                 "--method", "sum", "-k", "3", "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(hits) == 3 and all(h["id"] != 1 for h in hits)  # the reference is not its own result
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    ref = next(folder.rglob("test-*.png"))
    assert main(["search", "--index", str(out), "--reference", str(ref), "--text", "a star", "--method", "slerp",
                 "-k", "2"]) == 0
    assert capsys.readouterr().out.count("\n") == 4  # header, rule, 2 rows
    assert main(["search", "--index", str(out), "--reference", "1", "--text", "x", "--method", "foco"]) == 2
    assert "foco needs --checkpoint" in capsys.readouterr().err


def test_an_index_of_another_backbone_or_folder_is_refused(folder, tmp_path, capsys):
    out = tmp_path / "index"
    build_index(_cfg(folder), out)
    with pytest.raises(ValueError, match="images .* \\(now"):
        build_index(_cfg(tmp_path), out)
