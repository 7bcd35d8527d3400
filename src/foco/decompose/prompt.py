"""The LLM prompt for caption decomposition, and strict parsing of the answer.

The prompt is a system instruction plus few-shot examples as alternating user/assistant turns, so it works with
any chat-completions server. The answer must be one JSON object {"pairs": [{"local": ..., "context": ...}, ...]};
a Markdown code fence around it is tolerated, anything else is an InvalidAnswer.
"""
from __future__ import annotations

import json
import re

from .client import InvalidAnswer  # noqa: F401  (raised by parse_answer; callers catch it from here)
from .schema import LocalContextPair

PROMPT_VERSION = 1

SYSTEM = """You split an image caption into pairs of a local caption and a contextual caption, for training an \
image retrieval model.
- A local caption is a short phrase copied from the caption that names exactly one thing in the picture: an object \
with its attributes (colour, size, material), a person, or the background or place.
- Its contextual caption is the caption rewritten without that thing: it describes everything else in the scene.
- Give between {min_pairs} and {max_pairs} pairs, one per thing, in the order they appear. Use only words from the \
caption; never invent objects.
- Answer with one JSON object and nothing else: {{"pairs": [{{"local": "...", "context": "..."}}]}}"""

EXAMPLES: tuple[tuple[str, list[tuple[str, str]]], ...] = (
    ("a man in a red jacket rides a bicycle down a busy city street",
     [("a man in a red jacket", "someone rides a bicycle down a busy city street"),
      ("a bicycle", "a man in a red jacket rides down a busy city street"),
      ("a busy city street", "a man in a red jacket rides a bicycle")]),
    ("two grey cats sleeping on a blue sofa next to an open window",
     [("two grey cats", "a blue sofa next to an open window"),
      ("a blue sofa", "two grey cats sleeping next to an open window"),
      ("an open window", "two grey cats sleeping on a blue sofa")]),
    ("a wooden bowl of green apples and a glass vase with yellow tulips on a kitchen table",
     [("a wooden bowl of green apples", "a glass vase with yellow tulips on a kitchen table"),
      ("a glass vase with yellow tulips", "a wooden bowl of green apples on a kitchen table"),
      ("a kitchen table", "a wooden bowl of green apples and a glass vase with yellow tulips")]),
)


def _answer_json(pairs: list[tuple[str, str]]) -> str:
    return json.dumps({"pairs": [{"local": a, "context": b} for a, b in pairs]})


def build_messages(caption: str, min_pairs: int = 3, max_pairs: int = 5) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM.format(min_pairs=min_pairs, max_pairs=max_pairs)}]
    for example, pairs in EXAMPLES:
        msgs.append({"role": "user", "content": f"Caption: {example}"})
        msgs.append({"role": "assistant", "content": _answer_json(pairs)})
    msgs.append({"role": "user", "content": f"Caption: {caption}"})
    return msgs


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_WORD = re.compile(r"[\w'-]+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def parse_answer(text: str, caption: str, min_pairs: int = 1, max_pairs: int = 5) -> list[LocalContextPair]:
    """Validates an answer: JSON, the pair count within [min_pairs, max_pairs], non-empty strings, every local
    phrase grounded (each of its words occurs in the caption), no repeated local phrase."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidAnswer(f"not valid JSON ({exc.msg} at char {exc.pos})") from exc
    pairs = data.get("pairs") if isinstance(data, dict) else data
    if not isinstance(pairs, list):
        raise InvalidAnswer("no 'pairs' list")
    if not min_pairs <= len(pairs) <= max_pairs:
        raise InvalidAnswer(f"{len(pairs)} pairs, expected {min_pairs}-{max_pairs}")
    caption_words = set(_words(caption))
    out, seen = [], set()
    for k, p in enumerate(pairs):
        if not isinstance(p, dict) or not isinstance(p.get("local"), str) or not isinstance(p.get("context"), str):
            raise InvalidAnswer(f"pair {k} needs string fields 'local' and 'context'")
        local, context = p["local"].strip(), p["context"].strip()
        if not local or not context:
            raise InvalidAnswer(f"pair {k} has an empty {'local' if not local else 'context'} caption")
        missing = [w for w in _words(local) if w not in caption_words]
        if missing:
            raise InvalidAnswer(f"pair {k}: local phrase {local!r} is not grounded in the caption "
                                f"(missing {', '.join(missing[:3])})")
        if local.lower() in seen:
            raise InvalidAnswer(f"pair {k}: local phrase {local!r} repeated")
        seen.add(local.lower())
        out.append(LocalContextPair(local, context))
    return out
