"""Issue 43, the folder index: `foco index build --images` opens, hashes and preprocesses its files in DataLoader
workers (`foco.search.build.Opened`) and only encodes pixels here. The vectors, patches, image sizes, hashes and
skipped list are those of the images decoded one by one (`open_image` + `encode_images`), of an in-process build
and of a backbone without the pixel path; an unreadable file is skipped and listed, never fatal."""
from __future__ import annotations

import io
import os
import shutil
import struct
import zlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("faiss")

from foco import create_backbone  # noqa: E402
from foco.cli import main  # noqa: E402
from foco.search import build as B  # noqa: E402
from foco.search.build import IndexConfig, Opened, build_index, collate_opened, open_image, update_index  # noqa: E402
from foco.search.store import ImageStore  # noqa: E402
from foco.utils.io import sha256_file  # noqa: E402


def _png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header says `width` x `height`: Pillow's decompression-bomb check refuses it on open."""
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


@pytest.fixture
def folder(tiny_world, tmp_path):
    """Images of several sizes in nested folders (an EXIF-rotated JPEG among them), a corrupt PNG, a truncated JPEG,
    an image Pillow refuses as a decompression bomb, a file whose name is not UTF-8, and a non-image."""
    root = tmp_path / "photos"
    for i, p in enumerate(sorted((tiny_world / "images" / "test-single").glob("*.png"))[:9]):
        d = root / ("a" if i % 2 else "b/c")
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, d / p.name)
    im = Image.new("RGB", (48, 24), (200, 30, 60))
    im.paste((20, 200, 40), (0, 0, 16, 24))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated by 90 degrees
    im.save(root / "a" / "rotated.jpg", exif=exif)
    Image.new("RGB", (30, 70), (10, 90, 160)).save(root / "tall.webp")
    good = root / "b" / "c" / "whole.jpg"
    Image.effect_noise((64, 64), 40).convert("RGB").save(good, quality=90)
    (root / "cut.jpg").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    first = next(root.rglob("test-*.png"))
    (root / "broken.png").write_bytes(first.read_bytes()[:100])
    (root / "bomb.png").write_bytes(_png_claiming(9000, 9000))
    with open(os.path.join(os.fsencode(root), b"b\xffd.png"), "wb") as f:
        f.write(first.read_bytes())
    (root / "notes.txt").write_text("not an image")
    return root


class NoPixelPath:
    """world:pretrained without the pixel path (a stub backbone's shape): given decoded images."""

    def __init__(self, backbone):
        self._b, self.embed_dim, self.num_patches = backbone, backbone.embed_dim, backbone.num_patches
        self.spec, self.weights_sha256 = backbone.spec, backbone.weights_sha256
        self.calls = 0

    def encode_images(self, images, device="cpu"):
        self.calls += 1
        return self._b.encode_images(images, device)


class NotHere:
    """An image transform that refuses to run in the process that made it: the workers must do it."""

    def __init__(self, transform):
        self.transform, self.pid = transform, os.getpid()

    def __call__(self, im):
        assert os.getpid() != self.pid, "the image was preprocessed in the encoding process"
        return self.transform(im)


class WorkersOnly:
    """world:pretrained whose preprocessing must run in DataLoader workers and whose `encode_images` is never
    called: the build encodes pixels."""

    def __init__(self, backbone):
        self._b = backbone
        self.batches = []

    def __getattr__(self, name):
        return getattr(self._b, name)

    def image_transform(self):
        return NotHere(self._b.image_transform())

    def encode_images(self, images, device="cpu"):
        raise AssertionError("encode_images called: the build should encode the workers' pixels")

    def encode_pixels(self, pixels, device="cpu"):
        assert pixels.dtype == torch.uint8 and pixels.ndim == 4
        self.batches.append(pixels.shape[0])
        return self._b.encode_pixels(pixels, device)


def _index(out):
    """{path: (row, global vector, patches)} of an index."""
    with ImageStore(out / "images.sqlite", readonly=True) as store:
        rows = store.rows()
        return {p: (r, store.vector_rows([r.id])[0], store.patch_rows(r.id)) for p, r in rows.items()}


def test_workers_give_the_vectors_and_skips_of_images_decoded_one_by_one(folder, tmp_path):
    bb = create_backbone("world:pretrained")
    cfg = IndexConfig(images=str(folder), backbone="world:pretrained", batch_size=4, with_patches=True)
    workers = WorkersOnly(bb)
    stats = build_index(replace(cfg, workers=2), tmp_path / "w2", workers)
    assert (stats.encoded, stats.skipped) == (12, 4), stats
    assert workers.batches and sum(workers.batches) == 12  # every batch encoded as pixels, the unreadable left out
    here = build_index(replace(cfg, workers=0), tmp_path / "w0", bb)
    plain = NoPixelPath(bb)
    old = build_index(replace(cfg, workers=2), tmp_path / "pil", plain)  # no pixel path: decoded here, as before
    assert plain.calls and (here.encoded, here.skipped) == (old.encoded, old.skipped) == (12, 4)

    skipped = (tmp_path / "w2" / "skipped.tsv").read_text()
    for out in ("w0", "pil"):
        assert (tmp_path / out / "skipped.tsv").read_text() == skipped
    lines = dict(line.split("\t", 1) for line in skipped.splitlines()[1:])
    assert lines["b\\xffd.png"].startswith("its name is not valid UTF-8")
    assert lines["broken.png"].startswith("unreadable image") and lines["cut.jpg"].startswith("unreadable image")
    assert lines["bomb.png"].startswith("too many pixels")

    got, in_process, decoded = _index(tmp_path / "w2"), _index(tmp_path / "w0"), _index(tmp_path / "pil")
    assert set(got) == set(in_process) == set(decoded) and len(got) == 12
    for rel, (row, vec, patches) in got.items():
        im = open_image(folder / rel)
        want = bb.encode_images([im])
        assert (row.width, row.height) == im.size and row.sha256 == sha256_file(folder / rel)
        assert np.allclose(vec, want.global_[0].numpy(), atol=1e-5), rel
        assert np.allclose(patches.astype(np.float32), want.patches[0].numpy(), rtol=2e-3, atol=2e-3), rel  # fp16
        for other in (in_process, decoded):
            assert replace(other[rel][0], id=row.id) == row, rel
            assert np.allclose(other[rel][1], vec, atol=1e-5), rel
    assert got["a/rotated.jpg"][0].width == 24  # EXIF orientation applied in the worker


def test_an_indexed_file_that_becomes_unreadable_is_removed_by_a_worker_build(folder, tmp_path, capsys):
    out = tmp_path / "idx"
    cfg = IndexConfig(images=str(folder), backbone="world:pretrained", batch_size=3, workers=2)
    assert build_index(cfg, out).indexed == 12
    victim = folder / "a" / "rotated.jpg"
    victim.write_bytes(b"not an image any more" * 10)
    Image.new("RGB", (40, 40), "red").save(folder / "new.png")
    stats = update_index(out, workers=2)
    assert (stats.encoded, stats.removed, stats.unreadable_removed, stats.indexed) == (1, 1, 1, 12), stats
    line = next(x for x in (out / "skipped.tsv").read_text().splitlines() if x.startswith("a/rotated.jpg\t"))
    assert line.startswith("a/rotated.jpg\tunreadable image") and line.endswith(
        "; its earlier version was removed from the index")
    assert "a/rotated.jpg" not in _index(out)
    assert main(["index", "update", str(out), "--workers", "0"]) == 0  # nothing left to do, in this process
    assert "0 encoded now" in capsys.readouterr().out


def test_an_opened_item_is_pixels_size_and_hash_or_the_reason(folder):
    bb = create_backbone("world:pretrained")
    paths = [folder / "tall.webp", folder / "broken.png", folder / "a" / "rotated.jpg"]
    ds = Opened(paths, [None, None, "known"], bb.image_transform())
    pixels, size, digest, error = ds[0]
    assert pixels.dtype == torch.uint8 and size == (30, 70) and digest == sha256_file(paths[0]) and error is None
    assert ds[1][:3] == (None, None, None) and ds[1][3].startswith("unreadable image (")
    assert ds[2][1] == (24, 48) and ds[2][2] == "known"  # a digest known from the scan is not computed again
    images, meta = collate_opened([ds[i] for i in range(3)])
    assert images.shape[0] == 2 and [m[1] for m in meta] == [digest, None, "known"]
    assert collate_opened([ds[1]])[0] is None  # nothing readable in the batch
    assert isinstance(collate_opened([Opened(paths[:1], [None])[0]])[0][0], Image.Image)  # no transform: images


def test_the_loader_pins_on_the_backbones_device_and_uses_no_idle_worker(folder, monkeypatch):
    seen = {}
    real = B.make_loader

    def spy(dataset, **kw):
        seen.update(kw)
        return real(dataset, **{**kw, "device": "cpu"})
    monkeypatch.setattr(B, "make_loader", spy)
    bb = WorkersOnly(create_backbone("world:pretrained"))
    bb.device = torch.device("cuda", 0)
    todo = [("tall.webp", folder / "tall.webp", None, None)] * 3
    cfg = IndexConfig(images=str(folder), backbone="x", batch_size=2, workers=2)
    batches = list(B._opened_batches(bb, todo, cfg))
    assert seen["device"] == torch.device("cuda", 0) and seen["workers"] == 2 and len(batches) == 2
    list(B._opened_batches(bb, todo, IndexConfig(images=str(folder), backbone="x", batch_size=8, workers=4)))
    assert seen["workers"] == 1  # one batch: one worker
    list(B._opened_batches(NoPixelPath(bb._b), todo, IndexConfig(images=str(folder), backbone="x")))
    assert seen["workers"] == 0  # no pixel path: read in this process, as before


def test_the_cli_takes_workers_for_a_folder(tmp_path, capsys):
    for action in ("build", "update"):
        with pytest.raises(SystemExit):
            main(["index", action, "--help"])
        assert "--images: each file opened" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exit_:
        main(["index", "build", "--images", str(tmp_path), "--backbone", "world:pretrained", "--out",
              str(tmp_path / "o"), "--workers", "-1"])
    assert exit_.value.code == 2 and "argument --workers: -1 is negative" in capsys.readouterr().err
