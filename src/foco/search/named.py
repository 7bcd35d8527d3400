"""Index names: `foco serve --index NAME=FOLDER` (repeatable; a bare folder is named after itself), as
clip-retrieval's back end names the indexes it serves (`indices_paths`) and its clients pick one (`indice_name`).

A name is 1-64 characters of ASCII letters, digits, `_`, `.` and `-`, starting with a letter or a digit: it goes
into URLs (`/images/7?indice_name=NAME`) and JSON unchanged.
"""
from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str, flag: str = "--index") -> str:
    if not NAME.fullmatch(name):
        raise ValueError(f"{flag}: {name!r} is not an index name (1-64 letters, digits, '_', '.', '-', starting with "
                         "a letter or digit); name it with NAME=FOLDER")
    return name


def index_name(folder: str | Path) -> str:
    """The name a bare folder serves under: its own name as written (`runs/quickstart/index` -> `index`; a symlink
    keeps its own name), resolved only for `.` and `..`."""
    name = Path(folder).name
    if name in ("", ".", ".."):
        name = Path(folder).resolve().name
    if not NAME.fullmatch(name):
        raise ValueError(f"--index {folder}: the folder's name {name!r} cannot name an index (1-64 letters, digits, "
                         "'_', '.', '-'); give it one with --index NAME=FOLDER")
    return name


def named_indexes(values: list[str]) -> dict[str, Path]:
    """`--index` values, in order, as {name: folder}: NAME=FOLDER, or a bare FOLDER named after itself. A value
    whose part before '=' is not a valid name is a folder (a path may hold '='). Two indexes with one name are
    refused."""
    out: dict[str, Path] = {}
    for value in values:
        head, eq, tail = value.partition("=")
        if eq and NAME.fullmatch(head) and tail:
            name, folder = head, Path(tail)
        else:
            name, folder = index_name(value), Path(value)
        if name in out:
            raise ValueError(f"--index: two indexes are named {name!r} ({out[name]} and {folder}); name them apart "
                             "with --index NAME=FOLDER")
        out[name] = folder
    if not out:
        raise ValueError("--index: give at least one index folder")
    return out
