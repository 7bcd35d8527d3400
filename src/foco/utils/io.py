"""Small file helpers: atomic writes, strict JSON-lines reading, image loading that names the bad file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from PIL import Image


class ManifestError(ValueError):
    """A manifest or annotation file is missing or malformed. The message names the file (and line)."""


class ImageLoadError(OSError):
    """An image is missing or cannot be decoded. The message names the file."""


class WriteError(OSError):
    """An output file could not be written (full disk, file-size limit, read-only or unwritable folder). The file's
    previous content, if any, is intact."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_

    def __str__(self) -> str:
        return str(self.args[0])


def unwritable_reason(folder: str | Path) -> str | None:
    """Why files cannot be created in `folder` (its nearest existing ancestor), or None when they can."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "the file system is read-only"
    except OSError:
        pass
    if not os.access(folder, os.W_OK):
        return "the folder is not writable"
    return None


def _write_failed(path: Path, exc: OSError) -> WriteError:
    import errno
    why = {errno.ENOSPC: "the disk is full", errno.EFBIG: "the file is larger than this process may write",
           errno.EROFS: "the file system is read-only", errno.EACCES: "the folder is not writable",
           errno.EPERM: "the folder is not writable", errno.EDQUOT: "the disk quota is exceeded"
           }.get(exc.errno, exc.strerror or str(exc))
    return WriteError(f"cannot write {path}: {why}; nothing was overwritten. Free space or choose a writable --out, "
                      "then rerun the same command to resume", exc.errno)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Writes `data` to `path` so that readers see either the old file or the whole new one, with the permissions
    a plain `open(path, "wb")` would give (0666 minus the umask; mkstemp's own are 0600). A failed write (full
    disk, read-only folder) leaves no temporary file behind and raises `WriteError` naming `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _write_failed(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _write_failed(path, exc) from exc
        raise


def _umask() -> int:
    """The process umask: from /proc on Linux (no window where it is changed), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file; a line that is not UTF-8 text or not a
    JSON object raises ManifestError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"manifest not found: {path}")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ManifestError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                                    f"{exc.start + 1} of the line); re-save the file as UTF-8 (e.g. iconv -f latin1 -t "
                                    "utf-8)") from None
            if not line.strip():
                continue
            try:
                rec = loads_strict(line)
            except json.JSONDecodeError as exc:
                raise ManifestError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            except (ValueError, RecursionError) as exc:
                raise ManifestError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(rec, dict):
                raise ManifestError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            if "\\u" in line:  # only an escape can spell a lone surrogate (U+D800-U+DFFF) in UTF-8 text
                field = _surrogate_field(rec)
                if field is not None:
                    raise ManifestError(f"{path}:{lineno}: field {field} holds a lone surrogate (half of a UTF-16 "
                                        "pair, written as a \\uD8xx-\\uDFxx escape), which is not text any UTF-8 "
                                        "file or tokenizer can hold; fix the line")
            yield lineno, rec


def _surrogate_field(value: Any, name: str = "") -> str | None:
    """The dotted name of the first key or string in `value` that holds a lone surrogate, or None."""
    from .text import is_unicode
    if isinstance(value, str):
        return None if is_unicode(value) else (name or "(the value)")
    if isinstance(value, dict):
        for k, v in value.items():
            if not is_unicode(k):
                return f"{name}.(a key)" if name else "(a key)"
            found = _surrogate_field(v, f"{name}.{k}" if name else k)
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _surrogate_field(v, f"{name}[{i}]")
            if found:
                return found
    return None


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Reads a JSON-lines file; every line must be an object holding the `required` keys."""
    records = []
    for lineno, rec in iter_jsonl(path):
        missing = [k for k in required if k not in rec]
        if missing:
            raise ManifestError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        records.append(rec)
    return records


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is beyond a 64-bit float")
    return x


def _no_duplicates(pairs: list) -> dict:
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"the key {k!r} appears twice in one object (which one counts is up to the reader)")
        seen[k] = v
    return seen


def loads_strict(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (Python's json takes them; no other reader does), a
    number beyond a float (1e400), and a key given twice in one object."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_no_duplicates)


def read_json(path: str | Path) -> Any:
    """A JSON file, strictly: UTF-8, valid JSON, no NaN or Infinity; else ManifestError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"file not found: {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
        value = loads_strict(text)
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); the file "
                            "is damaged") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    field = _surrogate_field(value) if "\\u" in text else None
    if field is not None:
        raise ManifestError(f"{path}: field {field} holds a lone surrogate (half of a UTF-16 pair, written as a "
                            "\\uD8xx-\\uDFxx escape), which is not text any UTF-8 file or tokenizer can hold")
    return value


def load_image(path: str | Path) -> Image.Image:
    """Opens an image fully (decoding every pixel) as RGB, or raises ImageLoadError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ImageLoadError(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for corrupt data
        raise ImageLoadError(f"cannot decode image {path}: {exc}") from exc


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file's bytes, read in chunks."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_stamp(path: str | Path) -> dict:
    """What a record keeps of a file it vouches for: {"sha256", "bytes", "mtime_ns"}."""
    st = Path(path).stat()
    return {"sha256": sha256_file(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def stamp_problem(path: str | Path, stamp: dict) -> str | None:
    """What is wrong with `path` against its `file_stamp`, or None. The bytes are hashed only when the size or
    mtime differ from the stamp's (a reader of terabytes re-hashes nothing that was not touched)."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    st = path.stat()
    if st.st_size == stamp.get("bytes") and st.st_mtime_ns == stamp.get("mtime_ns"):
        return None
    if st.st_size != stamp.get("bytes") or sha256_file(path) != stamp.get("sha256"):
        return f"{path} changed since it was written (its size or sha256 differ from the record's)"
    return None


def iter_batches(items: list, batch_size: int) -> Iterator[list]:
    for i in range(0, len(items), batch_size):
        yield items[i:i + batch_size]


def load_tensors(path: str | Path, fix: str) -> dict:
    """The tensors of a safetensors file; a missing, truncated or foreign file is a ValueError that names it and
    says what fixes it (`fix`), never a bare SafetensorError."""
    from safetensors.torch import load_file
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; {fix}")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError, or OSError
        raise ValueError(f"{path} is not a readable safetensors file ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); {fix}") from None


def load_weights(module, state: dict, path: str | Path, fix: str, strict: bool = True) -> None:
    """`module.load_state_dict(state)`, with a mismatch (another width, another model) reported by file name."""
    try:
        module.load_state_dict(state, strict=strict)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line or "Missing" in line
                      or "Unexpected" in line), str(exc).splitlines()[0])
        raise ValueError(f"{path} does not fit this model ({first}); {fix}") from None
