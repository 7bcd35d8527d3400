"""The `llm` writer's prompt and its strict parser: one instruction (and optionally the target caption) for one
derived edit, as JSON.

The model sees the source caption and the edit (kind, the phrase, the new phrase or word) and answers
{"instruction": ...} (with "target" when asked). An answer is accepted only when it is valid JSON (a Markdown fence is
tolerated), the instruction has 2..`max_words` words, is neither the source nor the target caption, and is grounded:
it names the new phrase's content words (replace, add), the new word (attribute), or a content word of the removed
phrase (remove). A written target must differ from the source caption and carry the same new words.
"""
from __future__ import annotations

import json
import re

from ..decompose.client import InvalidAnswer
from .schema import Edit

PROMPT_VERSION = "edit-writer-1"
_STOP = {"a", "an", "the", "of", "on", "in", "with", "and", "some", "one", "to", "at", "under", "behind"}
SYSTEM = ("You write short image-editing instructions, the way a person asks an image search engine for a changed "
          "picture. Given a picture's caption and one edit, answer with JSON only: "
          '{"instruction": "<the request, at most 15 words, not a full caption>"}')
EXAMPLES = [
    ({"caption": "a brown dog on a sofa next to a lamp", "kind": "replace", "phrase": "a brown dog", "new": "a cat"},
     {"instruction": "put a cat on the sofa instead of the dog"}),
    ({"caption": "two red apples in a bowl", "kind": "attribute", "phrase": "two red apples", "old": "red",
      "new": "green"}, {"instruction": "the apples should be green"}),
    ({"caption": "a man riding a bike in the rain", "kind": "remove", "phrase": "the rain"},
     {"instruction": "same scene but on a dry day, no rain"}),
    ({"caption": "a sailboat on a lake", "kind": "add", "new": "a small red kayak"},
     {"instruction": "add a small red kayak next to the boat"}),
]


def edit_fields(caption: str, edit: Edit) -> dict[str, str]:
    fields = {"caption": caption, "kind": edit.kind, "phrase": edit.phrase, "old": edit.old, "new": edit.new}
    return {k: v for k, v in fields.items() if v}


def build_messages(caption: str, edit: Edit, write_target: bool) -> list[dict[str, str]]:
    system = SYSTEM + (' Also give the caption of the edited picture as "target".' if write_target else "")
    messages = [{"role": "system", "content": system}]
    for question, answer in EXAMPLES:
        messages += [{"role": "user", "content": json.dumps(question)},
                     {"role": "assistant", "content": json.dumps(answer)}]
    return messages + [{"role": "user", "content": json.dumps(edit_fields(caption, edit))}]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def required_words(edit: Edit) -> set[str]:
    """The content words an instruction must name (any one of them for remove)."""
    if edit.kind == "attribute":
        return {edit.new.lower()}
    return _words(edit.new if edit.kind in ("replace", "add") else edit.phrase) - _STOP


def parse_answer(text: str, caption: str, edit: Edit, write_target: bool, max_words: int = 25
                 ) -> tuple[str, str]:
    """(instruction, target caption) or InvalidAnswer saying why not; the target is the edit's own unless written."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    try:
        data = json.loads(fenced.group(1) if fenced else text)
    except json.JSONDecodeError as exc:
        raise InvalidAnswer(f"not valid JSON ({exc.msg})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("instruction"), str):
        raise InvalidAnswer("invalid fields: no instruction string")
    instruction = " ".join(data["instruction"].split())
    n = len(instruction.split())
    if not 2 <= n <= max_words:
        raise InvalidAnswer(f"invalid fields: the instruction has {n} words, expected 2..{max_words}")
    if instruction.lower() in (caption.lower(), edit.target.lower()):
        raise InvalidAnswer("invalid fields: the instruction repeats a caption")
    need, have = required_words(edit), _words(instruction)
    if need and (not need & have if edit.kind == "remove" else not need <= have):
        raise InvalidAnswer(f"not grounded: the instruction does not name {sorted(need)}")
    target = edit.target
    if write_target:
        target = " ".join(str(data.get("target", "")).split())
        if not target or target.lower() == caption.lower():
            raise InvalidAnswer("invalid fields: no target caption, or the source caption again")
        if edit.kind != "remove" and not need <= _words(target):
            raise InvalidAnswer(f"not grounded: the target does not name {sorted(need)}")
    return instruction, target
