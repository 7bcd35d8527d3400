"""Reading captions to decompose: CSV, TSV, JSONL, or a world folder's pairs manifests.

- JSONL: one object per line with "caption" and optionally "id" (or "image"/"url") and a "decomposition" (the
  world's manifests have one; the oracle needs it).
- CSV / TSV with a header: the caption column is `caption_column` (`--caption-column`) or the first of
  caption/text/alt/title, the id column the first of id/image/url/file/filepath/path.
- CSV / TSV without a header (CC3M's `caption<TAB>url`, or `url<TAB>caption`, or `image,caption`): two columns;
  the one that looks like a URL or a file path in every row is the id, the other the caption. A first row whose
  would-be id does not look like one is a header without a known caption column, and is refused, never read as
  data.
- A world folder: its `pairs/<split>.jsonl`.
- Webdataset tar shards, as img2dataset writes them ('shards/{00000..00099}.tar'): each sample's key is its id and
  its .txt (else the "caption" of its .json) the caption (`foco.corpora.webdataset`).
A malformed row raises ManifestError naming the file and line; nothing is skipped. A caption with a control
character (NUL included) is malformed (`foco.utils.text`); a very long one is read, and decomposed in pieces.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from ..utils.io import ManifestError, iter_jsonl
from .schema import Decomposition

CAPTION_COLUMNS = ("caption", "text", "alt", "title")
ID_COLUMNS = ("id", "image", "url", "file", "filepath", "path")


@dataclass
class CaptionRecord:
    id: str
    caption: str
    truth: Decomposition | None = None


def read_captions(path: str | Path, split: str = "train", caption_column: str | None = None) -> list[CaptionRecord]:
    from ..corpora.webdataset import is_shard_pattern
    if is_shard_pattern(path):
        return _read_shards(str(path))
    path = Path(path)
    if path.is_dir():
        manifest = path / "pairs" / f"{split}.jsonl"
        if not manifest.is_file():
            raise ManifestError(f"{path} is a folder but not a world folder: {manifest} not found")
        return _read_jsonl(manifest)
    if not path.is_file():
        raise ManifestError(f"caption file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix in (".tsv", ".csv", ".txt"):
        return _read_table(path, "\t" if suffix in (".tsv", ".txt") else ",", caption_column)
    raise ManifestError(f"{path}: unknown caption format {suffix!r}; use .csv, .tsv or .jsonl")


def _read_shards(pattern: str) -> list[CaptionRecord]:
    from ..corpora.webdataset import shard_paths
    return read_shard_captions(shard_paths(pattern))


def read_shard_captions(shards: list[Path]) -> list[CaptionRecord]:
    """The captions of these webdataset shards' samples, in order (a rank's own shards, `foco train --in`)."""
    from ..corpora.webdataset import iter_shard
    out, seen = [], {}
    for shard in shards:
        for sample in iter_shard(shard, with_images=False):
            if not sample.caption or not sample.caption.strip():
                raise ManifestError(f"{shard}: sample {sample.key} has no caption (.txt, or 'caption' in its .json)")
            _check_caption(sample.caption, f"{shard}: sample {sample.key}")
            if sample.key in seen:
                raise ManifestError(f"{shard}: sample key {sample.key} is also in {seen[sample.key]}")
            seen[sample.key] = shard
            out.append(CaptionRecord(sample.key, sample.caption.strip()))
    return out


def _read_jsonl(path: Path) -> list[CaptionRecord]:
    out = []
    for lineno, rec in iter_jsonl(path):
        if not isinstance(rec.get("caption"), str) or not rec["caption"].strip():
            raise ManifestError(f"{path}:{lineno}: needs a non-empty string field 'caption'")
        _check_caption(rec["caption"], f"{path}:{lineno}")
        truth = None
        if "decomposition" in rec:
            try:
                truth = Decomposition.from_dict(rec["decomposition"])
            except ValueError as exc:
                raise ManifestError(f"{path}:{lineno}: bad decomposition: {exc}") from exc
        rid = rec.get("id", rec.get("image", rec.get("url", lineno)))
        out.append(CaptionRecord(str(rid), rec["caption"], truth))
    return out


def _check_caption(caption: str, where: str) -> None:
    from ..utils.text import text_problem
    problem = text_problem(caption)
    if problem:
        raise ManifestError(f"{where}: the caption {problem}; remove such characters from the file (e.g. "
                            "`tr -d '\\000-\\010\\013\\014\\016-\\037\\177'`) and run again: nothing was stored")


def _looks_like_id(value: str) -> bool:
    v = value.strip()
    return v.startswith(("http://", "https://", "s3://", "/")) or (" " not in v and ("/" in v or "." in v[-6:]))


def _id_column(path: Path, rows: list[tuple[int, list[str]]]) -> int:
    """The id column of a headerless two-column table: the one that looks like a URL or path in every row."""
    for col in (0, 1):
        body = [r for _, r in rows[1:] if len(r) == 2]  # a ragged row is reported with its line afterwards
        if all(_looks_like_id(r[col]) and not _looks_like_id(r[1 - col]) for r in body) or not body:
            first = rows[0][1]
            if _looks_like_id(first[col]) and not _looks_like_id(first[1 - col]):
                return col
            if body:
                raise ManifestError(
                    f"{path}:{rows[0][0]}: the first row {first} looks like a header, but no column is named "
                    f"{'/'.join(CAPTION_COLUMNS)}: name the caption column with --caption-column")
    raise ManifestError(f"{path}: a headerless table needs an id column (URL or file path) and a caption column; "
                        f"add a header with a 'caption' column, or name it with --caption-column")


def _read_table(path: Path, delimiter: str, caption_column: str | None = None) -> list[CaptionRecord]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ManifestError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); re-save the file as "
                            "UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(raw) + 1))  # one long caption is data, not a reason to fail
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    except csv.Error as exc:
        raise ManifestError(f"{path}: not a valid {'TSV' if delimiter == chr(9) else 'CSV'} file ({exc})") from None
    finally:
        csv.field_size_limit(limit)
    rows = [(i, r) for i, r in enumerate(rows, 1) if any(c.strip() for c in r)]
    if not rows:
        raise ManifestError(f"{path}: no rows")
    header = [c.strip().lower() for c in rows[0][1]]
    if caption_column is not None and caption_column.strip().lower() not in header:
        raise ManifestError(f"{path}:{rows[0][0]}: --caption-column {caption_column!r} is not in the header "
                            f"{rows[0][1]}")
    names = (caption_column.strip().lower(),) if caption_column is not None else CAPTION_COLUMNS
    cap_col = next((header.index(c) for c in names if c in header), None)
    if cap_col is not None:
        id_col = next((header.index(c) for c in ID_COLUMNS if c in header), None)
        body = rows[1:]
    else:
        first = rows[0][1]
        if len(first) != 2:
            raise ManifestError(f"{path}:{rows[0][0]}: without a header the file needs exactly 2 columns "
                                f"(id and caption), found {len(first)}; or add a header with a 'caption' column")
        id_col = _id_column(path, rows)
        cap_col = 1 - id_col
        body = rows
    width = len(rows[0][1])
    out = []
    for lineno, r in body:
        if len(r) != width:
            raise ManifestError(f"{path}:{lineno}: expected {width} columns, found {len(r)}")
        caption = r[cap_col].strip()
        if not caption:
            raise ManifestError(f"{path}:{lineno}: empty caption")
        _check_caption(caption, f"{path}:{lineno}")
        out.append(CaptionRecord(r[id_col].strip() if id_col is not None else str(lineno), caption))
    return out
