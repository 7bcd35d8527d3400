"""Reliability (issue 13, finding 1): flagged captions (a fallback wrote them) can be asked again with
`--retry-flagged`, reports count them, and training refuses a store with more of them than --max-fallback."""
from __future__ import annotations

import pytest

from foco.decompose.run import run_decompose
from foco.decompose.schema import Decomposition, LocalContextPair
from foco.decompose.store import DecompositionStore


class Flaky:
    """A decomposer that falls back (flags) on the captions it is told to, as an LLM decomposer does on failures."""

    settings = {"name": "llm", "model": "fake"}

    def __init__(self, failing: set[str]):
        self.failing, self.asked = failing, []

    def decompose_batch(self, captions):
        self.asked += captions
        return [Decomposition(c, [LocalContextPair(c.split()[1], c)], flag="fallback:rule" if c in self.failing
                              else "") for c in captions]


def test_retry_flagged_asks_again_for_exactly_the_flagged(tmp_path):
    caps = [f"a red{i} circle" for i in range(6)]
    store = tmp_path / "s.sqlite"
    first = run_decompose(caps, Flaky({caps[1], caps[4]}), store, show_progress=False)
    assert (first.flagged, first.flagged_in_store) == (2, 2) and "--retry-flagged" in first.summary()
    again = run_decompose(caps, Flaky(set()), store, show_progress=False)  # a plain rerun changes nothing
    assert again.done_now == 0 and again.flagged_in_store == 2
    fixer = Flaky(set())
    retry = run_decompose(caps, fixer, store, show_progress=False, retry_flagged=True)
    assert fixer.asked == [caps[1], caps[4]] and retry.retried == 2 and retry.flagged_in_store == 0
    with DecompositionStore(store) as s:
        assert s.count() == 6 and s.flagged(s.resolve("llm")) == 0


def test_training_refuses_too_many_fallbacks(tiny_world, tmp_path):
    from foco.world.decompositions import world_decompositions
    from foco.world.manifest import load_pairs
    caps = [p.caption for p in load_pairs(tiny_world, "train")]
    store = tmp_path / "s.sqlite"
    run_decompose(caps, Flaky(set(caps[: len(caps) // 10])), store, show_progress=False)  # 10 % flagged
    with pytest.raises(ValueError, match=r"written by a fallback, more than --max-fallback 0.01.*--retry-flagged"):
        world_decompositions(tiny_world, "train", store, "llm")
    assert len(world_decompositions(tiny_world, "train", store, "llm", max_fallback=0.2)) == len(caps)
