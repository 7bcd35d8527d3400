"""The one rule for text that foco reads from files and requests (captions, modification texts, queries).

A text is refused, naming its file and line (or field), when it

- holds a control character: U+0000-U+0008, U+000B, U+000C, U+000E-U+001F or U+007F-U+009F (the C0 and C1
  controls, NUL and DEL included; tab, line feed and carriage return are whitespace and allowed). Such bytes come
  from broken exports or binary data pasted into a caption, and a tokenizer would encode them as if they were
  words;
- holds a lone surrogate (U+D800-U+DFFF): half of a UTF-16 pair, which no UTF-8 file or tokenizer can hold (a JSON
  body's "\ud800" decodes to one);
- is longer than `MAX_TEXT_CHARS` where a reader sets that limit (a request's text; captions are decomposed in
  pieces instead, `foco.decompose.rule`);
- is blank, where a text is required (a modification text, a caption): nothing but whitespace and invisible
  format characters (zero-width spaces and joiners, the byte-order mark, soft hyphens: Unicode's Cf category), and
  marks with no character to carry them (combining accents and variation selectors alone: Mn, Me).

Nothing is stripped or substituted: the fix is the user's, and the message says which character and where.
"""
from __future__ import annotations

import re
import unicodedata

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_TEXT_CHARS = 10_000  # a request's text (CLIP reads 77 tokens; a search box never needs more)


def text_problem(text: object, allow_empty: bool = False, max_chars: int | None = None) -> str | None:
    """What makes `text` unusable under the rule above, or None."""
    if not isinstance(text, str):
        return f"is not a string ({type(text).__name__})"
    if not allow_empty and is_blank(text):
        return "is empty" if not text.strip() else "is blank (only invisible format characters or marks)"
    m = _CONTROL.search(text)
    if m:
        return f"holds the control character U+{ord(m.group()):04X} at character {m.start() + 1}"
    m = _SURROGATE.search(text)
    if m:
        return (f"holds a lone surrogate U+{ord(m.group()):04X} at character {m.start() + 1}, which is not valid "
                "Unicode text")
    if max_chars is not None and len(text) > max_chars:
        return f"is {len(text):,} characters long, beyond the {max_chars:,} allowed"
    return None


def is_unicode(text: str) -> bool:
    """Whether `text` holds no lone surrogate, so that it encodes as UTF-8 (a file name of undecodable bytes, as
    `os` decodes it, does not)."""
    return _SURROGATE.search(text) is None


def is_blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace, format characters (U+200B, U+FEFF, ...) and marks that
    decorate nothing (U+0301, U+FE0F alone). It stops at the first visible character, so a long caption costs
    nothing."""
    for ch in text:
        if not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE:
            return False
    return True


_INVISIBLE = {"Cf", "Mn", "Me"}  # format characters; nonspacing and enclosing marks (they draw on a base only)


def first_control(text: str) -> str | None:
    """The first control character of `text` as U+XXXX, or None."""
    m = _CONTROL.search(text)
    return None if m is None else f"U+{ord(m.group()):04X}"
