"""Strict reading of official annotation files: a problem is reported with the file, what is wrong and how often."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..utils.io import ManifestError, read_json


def read_annotation(path: Path, kind: type, hint: str = "") -> Any:
    """The JSON content of `path`, which must be a `kind` (list or dict)."""
    if not path.is_file():
        raise ManifestError(f"annotation file not found: {path}{f' ({hint})' if hint else ''}")
    data = read_json(path)
    if not isinstance(data, kind):
        raise ManifestError(f"{path}: expected a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _describe(entry: Any, index: int, id_key: str | None) -> str:
    if id_key and isinstance(entry, dict) and id_key in entry:
        return f"#{index} ({id_key} {entry[id_key]})"
    return f"#{index}"


def require(path: Path, entries: Sequence[Any], fields: Iterable[str], id_key: str | None = None) -> None:
    """At least one entry, each an object holding every field; otherwise one error listing, per field, how many
    entries lack it."""
    if not entries:
        raise ManifestError(f"{path}: no entries")
    not_objects = [i for i, e in enumerate(entries) if not isinstance(e, dict)]
    if not_objects:
        raise ManifestError(f"{path}: {len(not_objects)} entr(ies) are not JSON objects, e.g. #{not_objects[:3]}")
    problems = []
    for f in fields:
        lacking = [i for i, e in enumerate(entries) if f not in e]
        if lacking:
            problems.append(f"{len(lacking)} entr(ies) lack '{f}', e.g. "
                            + ", ".join(_describe(entries[i], i, id_key) for i in lacking[:3]))
    if problems:
        raise ManifestError(f"{path}: " + "; ".join(problems))


def check_each(path: Path, entries: Sequence[Any], ok: Callable[[Any], bool], what: str,
               id_key: str | None = None) -> None:
    """Raises when `ok(entry)` is false for any entry, saying how many and which."""
    bad = [i for i, e in enumerate(entries) if not ok(e)]
    if bad:
        raise ManifestError(f"{path}: {len(bad)} entr(ies) with {what}, e.g. "
                            + ", ".join(_describe(entries[i], i, id_key) for i in bad[:3]))


def check_known(path: Path, what: str, ids: Iterable[str], known: set[str] | dict, where: str) -> None:
    """Every id is in `known`; otherwise: "N <what> not in <where>, e.g. ..."."""
    unknown = list(dict.fromkeys(i for i in ids if i not in known))
    if unknown:
        raise ManifestError(f"{path}: {len(unknown)} {what} not in {where}, e.g. {', '.join(map(str, unknown[:3]))}")


def check_unique(path: Path, what: str, ids: Sequence[str]) -> None:
    seen: set[str] = set()
    dups = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
    if dups:
        raise ManifestError(f"{path}: {len(dups)} duplicate {what}, e.g. {', '.join(map(str, dups[:3]))}")


def check_texts(path: Path, entries: Sequence[Any], get: Callable[[Any], Iterable[str]], field: str,
                id_key: str | None = None, allow_empty: bool = False) -> None:
    """Every text `get(entry)` gives is a string without control characters and, unless `allow_empty`, not
    empty (`foco.utils.text`); otherwise one error saying how many entries fail, which, and why."""
    from ..utils.text import text_problem
    bad = []
    for i, e in enumerate(entries):
        for t in get(e):
            problem = text_problem(t, allow_empty=allow_empty)
            if problem:
                bad.append((i, problem))
                break
    if bad:
        raise ManifestError(f"{path}: {len(bad)} entr(ies) whose '{field}' " + bad[0][1] + ", e.g. "
                            + ", ".join(_describe(entries[i], i, id_key) + f" ({why})" for i, why in bad[:3])
                            + "; a modification text must be non-empty, without control characters: fix the file")
