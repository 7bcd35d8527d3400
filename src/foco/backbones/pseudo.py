"""Pseudo tokens: encoding a text in which a placeholder word ("*") stands for a given token embedding.

Pic2Word-style methods map an image to a vector in the text tower's token-embedding space and read it as a word
("a photo of * that ..."). A backbone that supports this implements `PseudoTokenBackbone` on top of `Backbone`:

* `token_dim`: E, the width of the token-embedding space (CLIP: the text width; world: MiniLM's 384);
* `token_embedding(word)`: (E,) the input embedding of a single-token word;
* `encode_texts_with_tokens(texts, embeddings, placeholder)`: the `TextFeatures` of `encode_texts(texts)` with the
  embedding of each text's placeholder token(s) replaced by `embeddings[b]`. It runs in the caller's grad mode,
  so a mapping network trains through the frozen text tower.

Replacing the placeholder by a real word's own `token_embedding` gives the features of the text with that word.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from .base import Backbone, TextFeatures


@runtime_checkable
class PseudoTokenBackbone(Backbone, Protocol):
    @property
    def token_dim(self) -> int: ...

    def token_embedding(self, word: str) -> torch.Tensor: ...

    def encode_texts_with_tokens(self, texts: Sequence[str], embeddings: torch.Tensor,
                                 placeholder: str = "*", keep: tuple[int, int] | None = None) -> TextFeatures: ...


def placeholder_slots(input_ids: torch.Tensor, placeholder_id: int, texts: Sequence[str], placeholder: str,
                      embeddings: torch.Tensor, keep: tuple[int, int] | None = None) -> torch.Tensor:
    """(B, L) bool, True where `input_ids` holds the placeholder. Every text must hold it (at least once), and
    `embeddings` must be (B, E).

    `keep` = (first, last): only the first `first` and the last `last` placeholders of each text are slots, those
    of a query template around a user's text (`foco.methods.pic2word.template_slots`), so that the user's own
    placeholder characters stay the words they typed."""
    if embeddings.ndim != 2 or embeddings.shape[0] != len(texts):
        raise ValueError(f"expected ({len(texts)}, E) embeddings, got {tuple(embeddings.shape)}")
    slots = input_ids == placeholder_id  # (B, L)
    if keep is not None:
        first, last = keep
        seen = slots.long().cumsum(1)  # (B, L): placeholders up to each position
        total = seen[:, -1:]  # (B, 1)
        short = [t for t, n in zip(texts, total[:, 0].tolist()) if n < first + last]
        if short:
            raise ValueError(f"{len(short)} text(s) hold fewer than the template's {first + last} {placeholder!r} "
                             f"tokens (truncated?), e.g. {short[0]!r}")
        slots = slots & ((seen <= first) | (seen > total - last))
    missing = [t for t, row in zip(texts, slots) if not bool(row.any())]
    if missing:
        raise ValueError(f"{len(missing)} text(s) hold no {placeholder!r} token (truncated, or not separated by "
                         f"spaces?), e.g. {missing[0]!r}")
    return slots


def single_token_id(tokenizer, word: str) -> int:
    """The id of `word` when the tokenizer reads it as exactly one token (no special tokens)."""
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{word!r} is {len(ids)} tokens for this tokenizer, not one")
    return int(ids[0])
