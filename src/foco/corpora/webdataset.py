"""Image-caption corpora as webdataset tar shards, the layout img2dataset writes (issue 15):

    shards/00000.tar:   000000000.jpg (or .png)   the image
                        000000000.txt             the caption
                        000000000.json            metadata (img2dataset: key, caption, url, width, height, ...)

A shard pattern uses brace expansion, as webdataset does: 'shards/{00000..00099}.tar'. Samples are read in order,
grouped by key (the file name up to its first dot), and written, with the standard library's tarfile in the
layout webdataset and img2dataset use, so the core needs no extra package. `foco world export --format webdataset`
writes the world's pairs this way, so the corpus path is tested end to end.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..utils.io import ManifestError, atomic_write_bytes

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def expand_pattern(pattern: str) -> list[str]:
    """Brace expansion of '{00000..00099}' ranges (zero padding kept) and '{a,b}' lists, as webdataset's
    braceexpand does; a plain path is itself."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body, head, tail = m.group(1), pattern[:m.start()], pattern[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        a, b = r.group(1), r.group(2)
        width = len(a) if a.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(a), int(b) + 1)]
    else:
        items = body.split(",")
    return [p for item in items for p in expand_pattern(head + item + tail)]


def is_shard_pattern(value: str | Path) -> bool:
    return str(value).endswith(".tar") or ".tar}" in str(value) or (".tar" in str(value) and "{" in str(value))


@dataclass
class Sample:
    key: str
    shard: str
    image: bytes | None
    image_ext: str | None
    caption: str | None
    meta: dict


def shard_paths(pattern: str) -> list[Path]:
    paths = [Path(p) for p in expand_pattern(str(pattern))]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} shards of {pattern} are missing, e.g. {missing[0]}")
    return paths


def tar_files(path: str | Path, error: type[Exception] = ManifestError
              ) -> Iterator[tuple[str, str, tarfile.TarInfo, tarfile.TarFile]]:
    """(key, extension lowercased with its dot, member, the open tar) of every file of shard `path`, in the tar's
    order: the one walk over a shard's headers that every reader shares. A shard that is not a readable tar raises
    `error` naming it."""
    try:
        tar = tarfile.open(path, "r")
    except (tarfile.TarError, OSError) as exc:
        raise error(f"{path}: not a readable tar shard ({exc})") from None
    with tar:
        try:
            for member in tar:
                if member.isfile():
                    key, _, ext = Path(member.name).name.partition(".")
                    yield key, "." + ext.lower(), member, tar
        except (tarfile.TarError, OSError) as exc:
            at = min(tar.offset, Path(path).stat().st_size)
            raise error(f"{path}: damaged or cut short at byte offset {at} ({exc}); fetch the shard again or leave "
                        "it out of --in") from None
        problem = _end_problem(Path(path), tar.offset)
        if problem:
            raise error(f"{path}: {problem}; fetch the shard again or leave it out of --in")


def _end_problem(path: Path, end: int) -> str | None:
    """Why a tar whose last member ends at byte `end` is not whole: a complete archive ends with a zero block
    there (tarfile stops quietly at the end of a truncated file, so a shard cut in half would read as half of its
    samples)."""
    size = path.stat().st_size
    if size < end:
        return f"cut short: its last sample needs {end} bytes and the file has {size} (truncated at byte offset {size})"
    with open(path, "rb") as f:
        f.seek(end)
        block = f.read(512)
    if len(block) < 512 or block.count(0) != 512:
        return (f"cut short: no end-of-archive block at byte offset {end} (the file ends at {size}), so samples after "
                "it may be lost")
    return None


def iter_shard(path: Path, with_images: bool = True) -> Iterator[Sample]:
    """The samples of one tar shard, in order; a sample without an image and a caption is an error naming it."""
    current: dict | None = None
    for key, ext, member, tar in tar_files(path):
        if current is None or current["key"] != key:
            if current is not None:
                yield _sample(path, current)
            current = {"key": key, "files": {}}
        if ext in IMAGE_EXTS and not with_images:
            current["files"][ext] = b""
            continue
        current["files"][ext] = tar.extractfile(member).read()
    if current is not None:
        yield _sample(path, current)


def sample_text(path: Path, key: str, json_bytes: bytes | None, txt_bytes: bytes | None,
                error: type[Exception] = ManifestError) -> tuple[dict, object]:
    """A sample's metadata (its .json, {} without one) and caption (its .txt, else the .json's "caption"; None
    without either); a .json that is not JSON raises `error` naming the shard and the sample."""
    meta = {}
    if json_bytes is not None:
        try:
            meta = json.loads(json_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise error(f"{path}: sample {key}: its .json is not valid JSON ({exc})") from None
    caption = txt_bytes.decode("utf-8", "replace").strip() if txt_bytes is not None else \
        (meta.get("caption") if isinstance(meta, dict) else None)
    return meta, caption


def _sample(path: Path, s: dict) -> Sample:
    files = s["files"]
    img_ext = next((e for e in IMAGE_EXTS if e in files), None)
    meta, caption = sample_text(path, s["key"], files.get(".json"), files.get(".txt"))
    if img_ext is None and caption is None:
        raise ManifestError(f"{path}: sample {s['key']} has neither an image nor a caption")
    return Sample(s["key"], str(path), files.get(img_ext) if img_ext else None, img_ext, caption, meta)


def write_shards(samples: list[tuple[str, bytes, str, str, dict]], out: str | Path, shard_size: int = 1000
                 ) -> list[Path]:
    """Writes (key, image bytes, image extension, caption, metadata) samples into out/00000.tar, ... in order,
    each shard written whole and then moved into place (a reader never sees half a shard)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(samples), shard_size):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for key, image, ext, caption, meta in samples[s:s + shard_size]:
                for suffix, data in ((ext, image), (".txt", caption.encode("utf-8")),
                                     (".json", json.dumps(meta, sort_keys=True).encode("utf-8"))):
                    info = tarfile.TarInfo(f"{key}{suffix}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644  # reproducible bytes
                    tar.addfile(info, io.BytesIO(data))
        path = out / f"{s // shard_size:05d}.tar"
        atomic_write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths

