"""Edits derived from caption decompositions alone: no scene, no target image, no benchmark sampler.

From a caption with (local_k, context_k) pairs (paper §3.1; context_k is the caption without local_k):
* remove k:    target = context_k.
* replace k:   local_k -> a local phrase of another caption (a donor) whose head noun is of local_k's head's kind.
* attribute k: one word of local_k -> another word "of its kind", mined from the corpus's own local phrases: two
               modifier words are of one kind when they modify the same head nouns (at least `min_shared_heads`)
               and never occur in one phrase together ("red"/"blue" modify "circle" and "star" but never meet;
               "small"/"red" meet in "a small red circle"). Modifiers and heads come from spaCy's parse.
* add:         "{caption} with {donor phrase}", the donor's head of the kind of one of the caption's heads.
Kinds are distributional and need no lexicon: modifier words are of one kind as above, and two head nouns are of
one kind when they share at least `min_shared_heads` features. A head's features are its modifiers and the
prepositions that govern it in the full captions ("circle" and "star" are both "red", "small"), so that an object
is not replaced by a setting. Settings are the heads only ever seen inside a prepositional phrase ("on a beach",
"in a forest"); they take few modifiers and each its own preposition, so all settings are one kind (a setting
replacement, "a beach" -> "a forest", is a replace edit, and add never adds a second setting).
A local phrase is found in its caption with or without its article ("a night sky" in "against the night sky"), and
a phrase put in its place takes the article the caption used. Kinds are counted through an
inverted index over the 5,000 words with the most partners (`PhrasePool.build(max_words=...)`).
Negatives (the failed modifications PACT's negative captions stand for): the source caption (edit not applied),
the same edit on another local phrase of the caption (wrong phrase), and for replace the removal instead.

Choices are seeded per caption id (`caption_rng`), so a restarted job derives exactly the same edits.
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..decompose.schema import Decomposition
from .schema import Edit

KINDS = ("remove", "replace", "attribute", "add")
DERIVATION = 2  # part of a store's settings: a store written by another derivation is never resumed with this one


def caption_rng(seed: int, caption_id: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}\0{caption_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


_ARTICLE = re.compile(r"^(a|an|the)\s+", re.I)


def locate(text: str, phrase: str) -> str | None:
    """`phrase` as `text` writes it: itself, or with another article or none ("a night sky" -> "the night sky");
    None when it is not in `text` as whole words."""
    bare = _ARTICLE.sub("", phrase.strip(), count=1)
    for cand in (phrase, *(f"{a} {bare}" for a in ("the", "a", "an")), bare):
        if re.search(r"(?<!\w)" + re.escape(cand) + r"(?!\w)", text):
            return cand
    return None


def like_article(phrase: str, model: str) -> str:
    """`phrase` with the article of `model`: like_article("a night sky", "the beach") == "the night sky"."""
    m, bare = _ARTICLE.match(model), _ARTICLE.sub("", phrase.strip(), count=1)
    if m is None:
        return bare if _ARTICLE.match(phrase) else phrase
    art = m.group(1).lower()
    if art in ("a", "an"):
        return phrase if _ARTICLE.match(phrase) else f"a {bare}"
    return f"{m.group(1)} {bare}"


def swap_once(text: str, old: str, new: str) -> str | None:
    """`text` with the first whole-word occurrence of `old` replaced by `new`; None when `old` is not in it."""
    m = re.search(r"(?<!\w)" + re.escape(old) + r"(?!\w)", text)
    return None if m is None else text[:m.start()] + new + text[m.end():]


@dataclass
class PhrasePool:
    """The corpus's local phrases (donors) and its modifier words grouped by kind."""

    phrases: list[str]  # distinct local phrases, first-seen order
    parse: dict[str, tuple[str, tuple[str, ...]]]  # phrase -> (head noun, modifier words)
    kind_mates: dict[str, list[str]] = field(default_factory=dict)  # modifier -> modifiers of its kind, sorted
    head_mates: dict[str, set[str]] = field(default_factory=dict)  # head noun -> head nouns of its kind (itself too)
    settings: set[str] = field(default_factory=set)  # heads only ever seen in a prepositional phrase ("on a beach")

    @classmethod
    def build(cls, decompositions: list[Decomposition], nlp=None, min_shared_heads: int = 2,
              max_words: int = 5000) -> "PhrasePool":
        phrases = list(dict.fromkeys(p.local for d in decompositions for p in d.pairs))
        nlp = nlp or _spacy()
        governed = defaultdict(set)  # head noun -> "prep:on", "prep:under", ... as the full captions use it
        free = set()  # head nouns seen outside a prepositional phrase at least once
        from ..decompose.rule import split_pieces  # a long caption is parsed in pieces, as decompose parses it
        captions = [piece for c in dict.fromkeys(d.caption for d in decompositions) for piece in split_pieces(c)]
        for doc in nlp.pipe(captions, batch_size=256, disable=["ner", "lemmatizer"]):
            for tok in doc:
                if tok.pos_ not in ("NOUN", "PROPN"):
                    continue
                if tok.dep_ == "pobj" and tok.head.text.lower() != "with":
                    governed[tok.text.lower()].add("prep:" + tok.head.text.lower())
                else:
                    free.add(tok.text.lower())
        parse = {}
        # a phrase's head and modifiers are read from its first piece (a phrase is a few words; a huge one, only
        # an oracle's or an LLM's, is cut where decompose would cut it)
        for phrase, doc in zip(phrases, nlp.pipe((split_pieces(p)[0] for p in phrases), batch_size=256)):
            root = next((t for t in doc if t.head == t), None)
            mods = tuple(t.text for t in doc if t is not root and t.dep_ in ("amod", "compound", "nummod")
                         and t.pos_ in ("ADJ", "NOUN", "PROPN", "NUM"))
            parse[phrase] = (root.text.lower() if root is not None else "", mods)
        heads, together, mods = defaultdict(set), set(), defaultdict(set)
        for head, ms in parse.values():
            mods[head].update(ms)
            mods[head].update(governed.get(head, ()))
            for m in ms:
                heads[m].add(head)
            together.update((a, b) for a in ms for b in ms if a != b)
        mates = _mates(heads, min_shared_heads, max_words, exclude=together)
        head_mates = {h: {h, *m} for h, m in _mates(mods, min_shared_heads, max_words).items()
                      if h and len(mods[h]) >= min_shared_heads}
        settings = {h for h in governed if h not in free}
        for h in settings:  # settings rarely share prepositions ("on a beach", "in a forest"): they are one kind
            head_mates[h] = head_mates.get(h, {h}) | settings
        return cls(phrases, parse, {a: m for a, m in mates.items() if m}, head_mates, settings)


def _mates(features: dict[str, set[str]], min_shared: int, max_words: int,
           exclude: set[tuple[str, str]] = frozenset()) -> dict[str, list[str]]:
    """word -> the other words sharing at least `min_shared` features, through an inverted index; only the
    `max_words` words with the most features take part (a large corpus's long tail would be quadratic)."""
    kept = dict(sorted(features.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:max_words])
    index = defaultdict(set)
    for w, fs in kept.items():
        for f in fs:
            index[f].add(w)
    out = {}
    for w, fs in kept.items():
        shared = Counter(v for f in fs for v in index[f] if v != w)
        out[w] = sorted(v for v, c in shared.items() if c >= min_shared and (w, v) not in exclude)
    return out


def _spacy():
    from ..decompose.rule import load_spacy
    return load_spacy()


def derive_edits(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator, n: int = 1
                 ) -> list[Edit]:
    """Up to `n` distinct edits of one caption, kinds drawn uniformly among those its decomposition allows."""
    out: list[Edit] = []
    kinds = list(KINDS)
    while len(out) < n and kinds:
        kind = kinds[int(rng.integers(len(kinds)))]
        edit = _DERIVE[kind](dec, pool, rng)
        if edit is None or any(e.target == edit.target for e in out):
            kinds.remove(kind)
            continue
        out.append(edit)
    return out


def _span(dec: Decomposition, k: int) -> str | None:
    """Local phrase k as the caption writes it (`locate`)."""
    return locate(dec.caption, dec.pairs[k].local)


def _pick_pair(dec: Decomposition, rng: np.random.Generator) -> int | None:
    ok = [k for k, p in enumerate(dec.pairs) if p.context.strip() and _span(dec, k) is not None]
    return ok[int(rng.integers(len(ok)))] if ok else None


def _head(pool: PhrasePool, phrase: str) -> str:
    return pool.parse.get(phrase, ("", ()))[0]


def _donor(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator, like: str) -> str | None:
    """A local phrase of another caption whose head is of the kind of head `like`."""
    kind = pool.head_mates.get(like, set())
    own = {p.local for p in dec.pairs}
    for _ in range(50):
        cand = pool.phrases[int(rng.integers(len(pool.phrases)))] if pool.phrases and kind else None
        if cand is not None and _head(pool, cand) in kind and cand not in own \
                and locate(dec.caption.lower(), cand.lower()) is None:
            return cand
    return None


def _others(dec: Decomposition, k: int) -> list[int]:
    return [j for j, p in enumerate(dec.pairs) if j != k and p.local != dec.pairs[k].local]


def _remove(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator) -> Edit | None:
    k = _pick_pair(dec, rng)
    if k is None:
        return None
    wrong = tuple(dec.pairs[j].context for j in _others(dec, k))[:2]
    return Edit("remove", _span(dec, k), target=dec.pairs[k].context, negatives=(dec.caption, *wrong),
                provenance={"pair": k})


def _replace(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator) -> Edit | None:
    k = _pick_pair(dec, rng)
    donor = None if k is None else _donor(dec, pool, rng, _head(pool, dec.pairs[k].local))
    if donor is None:
        return None
    local = _span(dec, k)
    new = like_article(donor, local)
    target = swap_once(dec.caption, local, new)
    wrong = []  # the donor put in place of another phrase of its kind
    for j in _others(dec, k):
        other = _span(dec, j)
        if other and _head(pool, dec.pairs[j].local) in pool.head_mates.get(_head(pool, donor), set()):
            wrong.append(swap_once(dec.caption, other, like_article(donor, other)))
    negs = (dec.caption, *[w for w in wrong[:1] if w], dec.pairs[k].context)
    return Edit("replace", local, new=new, target=target, negatives=negs, provenance={"pair": k, "donor": donor})


def _attribute(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator) -> Edit | None:
    cands = [(k, m) for k, p in enumerate(dec.pairs) for m in pool.parse.get(p.local, ("", ()))[1]
             if m in pool.kind_mates and _span(dec, k) is not None]
    if not cands:
        return None
    k, old = cands[int(rng.integers(len(cands)))]
    mates = pool.kind_mates[old]
    new = mates[int(rng.integers(len(mates)))]
    local = _span(dec, k)
    new_local = swap_once(local, old, new)
    if new_local is None:
        return None
    target = swap_once(dec.caption, local, new_local)
    wrong = []  # the same change made to another phrase's word of that kind
    for j in _others(dec, k):
        other = _span(dec, j)
        for m in pool.parse.get(dec.pairs[j].local, ("", ()))[1]:
            if other and m != new and (m == old or m in mates):
                changed = swap_once(dec.caption, other, swap_once(other, m, new) or other)
                if changed and changed not in (target, dec.caption):
                    wrong.append(changed)
    return Edit("attribute", local, new=new, old=old, head=pool.parse[dec.pairs[k].local][0], target=target,
                negatives=(dec.caption, *wrong[:1]), provenance={"pair": k})


def _add(dec: Decomposition, pool: PhrasePool, rng: np.random.Generator) -> Edit | None:
    k = _pick_pair(dec, rng)  # a scene has one setting: add an object-like phrase, never a second setting
    if k is not None and _head(pool, dec.pairs[k].local) in pool.settings:
        k = next((j for j in _others(dec, k) if _span(dec, j) and _head(pool, dec.pairs[j].local) not in pool.settings),
                 None)
    new = None if k is None else _donor(dec, pool, rng, _head(pool, dec.pairs[k].local))
    if new is None:
        return None
    negs = [dec.caption, swap_once(dec.caption, _span(dec, k), like_article(new, _span(dec, k)))]
    return Edit("add", "", new=new, target=f"{dec.caption} with {new}", negatives=tuple(n for n in negs if n),
                provenance={"donor": new, "replaced_in_negative": k})


_DERIVE = {"remove": _remove, "replace": _replace, "attribute": _attribute, "add": _add}
