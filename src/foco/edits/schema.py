"""The records of `foco.edits`: an edit derived from a caption's decomposition, and the image-text-text (ITT)
triplet a writer makes of it (PACT, seeds/pact-chord.txt: source image, modification instruction, target caption,
optional negative captions; no target image)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Edit:
    """One edit of a source caption, derived from its decomposition alone.

    kind: "remove" (drop local phrase `phrase`), "replace" (`phrase` -> `new`, a local phrase of another caption),
    "attribute" (word `old` -> `new` inside `phrase`, a word of the same kind mined from the corpus) or "add"
    (`new`, another caption's local phrase, joins the scene).
    """

    kind: str
    phrase: str  # the local phrase the edit is about (for "add": "")
    new: str = ""  # the replacing phrase / word, or the added phrase
    old: str = ""  # "attribute": the word replaced
    head: str = ""  # "attribute": the phrase's head noun ("circle")
    target: str = ""  # the target caption
    negatives: tuple[str, ...] = ()  # captions of failed edits: not applied, applied to the wrong phrase, ...
    provenance: dict[str, Any] = field(default_factory=dict)  # phrase index, donor caption id, ...


@dataclass
class ITTRecord:
    """One training triplet: the source image and caption, the instruction, the target caption, negatives."""

    source_id: str
    source_caption: str
    kind: str
    instruction: str
    target_caption: str
    negatives: list[str]
    provenance: dict[str, Any]
    flag: str = ""  # why a fallback wrote it, when one did

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WriterOptions:
    """What a writer may be built from; each reads the fields it needs."""

    templates: str = "train"  # rule: "train" or "heldout"
    llm: Any = None  # llm: an `LLMWriterConfig`
