"""Checking foco's own record files against a schema: types, ranges, required fields.

A schema is a tree of `Field`s (`foco.records` holds one per artifact kind). `check(value, schema, path)` walks
it and raises `RecordError` naming the file and the dotted field (e.g. ``foco.json: config.heads``) with what was
expected and what was found; `read_record(path, schema)` reads a JSON file strictly (UTF-8, no NaN or Infinity)
and checks it. Fields not in a schema are kept unchecked (a newer foco may add some); a schema lists every field a
reader relies on.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .io import ManifestError

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}


class RecordError(ManifestError):
    """A record file foco wrote is damaged: the message names the file, the field and the fix."""


@dataclass(frozen=True)
class Field:
    """One value of a record. `kind`: "int", "float" (an int is accepted), "str", "bool", "dict", "list", "any",
    or several joined by "|" (e.g. "str|dict"). `lo`/`hi`: inclusive bounds of a number, the length of a str or
    list. `choices`: the values a str may take. `pattern`: a regular expression a str must match in full.
    `fields`: a dict's own fields; `items`: every item of a list, or every value of a dict with no `fields`.
    `optional`: may be absent; `nullable`: may be null. `rule`: a last check on the whole value, returning what
    is wrong or None."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None
    pattern: str | None = None
    fields: dict[str, "Field"] | None = None
    items: "Field | None" = None
    optional: bool = False
    nullable: bool = False
    rule: Callable[[Any], str | None] | None = field(default=None, compare=False)


def opt(f: Field) -> Field:
    """`f`, optional and nullable: a field older records may lack."""
    return Field(**{**f.__dict__, "optional": True, "nullable": True})


HEX64 = Field("str", pattern=r"[0-9a-f]{64}")
HEX16 = Field("str", pattern=r"[0-9a-f]{16}")
COUNT = Field("int", lo=0, hi=2 ** 53)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def problem(value: Any, spec: Field, name: str) -> tuple[str, str] | None:
    """(field, what is wrong) for the first fault of `value` against `spec`, or None."""
    if value is None:
        return None if spec.nullable else (name, "is null")
    kinds = spec.kind.split("|")
    kind = next((k for k in kinds if _type_ok(value, k)), None)
    if kind is None:
        return name, f"expected {' or '.join(kinds)}, got {_describe(value)}"
    if kind == "float" and not math.isfinite(value):
        return name, f"is {value}, not a finite number"
    size = len(value) if kind in ("str", "list") else value if kind in ("int", "float") else None
    if size is not None and spec.lo is not None and size < spec.lo:
        what = "length" if kind in ("str", "list") else "value"
        return name, f"{what} {size} is below {spec.lo}"
    if size is not None and spec.hi is not None and size > spec.hi:
        what = "length" if kind in ("str", "list") else "value"
        return name, f"{what} {size} is above {spec.hi}"
    if spec.choices is not None and value not in spec.choices:
        return name, f"is {value!r}, not one of {', '.join(map(repr, spec.choices))}"
    if spec.pattern is not None and kind == "str" and not re.fullmatch(spec.pattern, value):
        return name, f"{value[:40]!r} is not of the form {spec.pattern}"
    if kind == "dict" and spec.fields is not None:
        for key, sub in spec.fields.items():
            if key not in value:
                if not sub.optional:
                    return _join(name, key), "is missing"
                continue
            found = problem(value[key], sub, _join(name, key))
            if found:
                return found
    elif kind == "dict" and spec.items is not None:
        for key, item in value.items():
            found = problem(item, spec.items, _join(name, str(key)))
            if found:
                return found
    if kind == "list" and spec.items is not None:
        for i, item in enumerate(value):
            found = problem(item, spec.items, f"{name}[{i}]")
            if found:
                return found
    if spec.rule is not None:
        why = spec.rule(value)
        if why:
            return name or "(the record)", why
    return None


def _join(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


def check(value: Any, spec: Field, path: str | Path, fix: str) -> Any:
    """`value` when it matches `spec`; else RecordError naming `path`, the field and `fix`."""
    found = problem(value, spec, "")
    if found:
        name, why = found
        raise RecordError(f"{path}: field {name or '(the record)'} {why}: the record is damaged; {fix}")
    return value


def read_record(path: str | Path, spec: Field, fix: str) -> Any:
    """The JSON record at `path`, read strictly (`foco.utils.io.read_json`) and checked against `spec`."""
    from .io import read_json
    try:
        value = read_json(path)
    except ManifestError as exc:
        raise RecordError(f"{exc}; {fix}") from None
    return check(value, spec, path, fix)
