"""Issue 54's levers (NOT in the FoCo paper, off by default), each against a slow, obvious twin: harder negatives
(`--negative-groups`: batches of nearest-neighbour groups) and background dropout (`--background-dropout`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.train.foco import FoCoTrainConfig, nearest_neighbours, neighbour_order, train_foco

from test_param_groups import _table


def _twin_neighbours(g: torch.Tensor, m: int) -> list[list[int]]:
    out = []
    for i in range(g.shape[0]):
        sims = [(float(g[i] @ g[j]), j) for j in range(g.shape[0]) if j != i]
        out.append([j for _, j in sorted(sims, key=lambda x: -x[0])[:m]])
    return out


def test_nearest_neighbours_match_a_row_by_row_twin():
    g = torch.nn.functional.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert nearest_neighbours(g, 5, chunk=7).tolist() == _twin_neighbours(g, 5)


def test_neighbour_order_is_a_permutation_of_neighbour_groups():
    g = torch.nn.functional.normalize(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    nbrs = nearest_neighbours(g, 3)
    perm = np.random.default_rng(0).permutation(64)
    order = neighbour_order(perm, nbrs, 4)
    assert sorted(order.tolist()) == list(range(64))  # every image once
    assert order[0] == perm[0]  # groups start in the random order
    # the twin: walk the order; each group head's followers are its nearest not-yet-placed neighbours
    placed: set[int] = set()
    i = 0
    while i < len(order):
        head = int(order[i])
        placed.add(head)
        expect = [int(b) for b in nbrs[head].tolist() if int(b) not in placed][:3]
        got = [int(x) for x in order[i + 1:i + 1 + len(expect)]]
        assert got == expect
        placed.update(got)
        i += 1 + len(expect)
    # neighbours sit together: mean cosine within the 4-runs is above a random order's
    within = lambda o: np.mean([float(g[o[k]] @ g[o[k + 1]]) for k in range(0, 64, 4)])  # noqa: E731
    assert within(order) > within(perm) + 0.2


def test_grouped_batches_train_and_differ_from_uniform_ones(tmp_path):
    table = _table()
    base = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=8, model=FoCoConfig(heads=2))
    a = train_foco(table, tmp_path / "a", base)
    b = train_foco(table, tmp_path / "b", FoCoTrainConfig(**{**base.__dict__, "negative_groups": 4}))
    assert not torch.equal(a.comp.out.weight, b.comp.out.weight)
    with pytest.raises(ValueError, match="--negative-groups"):
        train_foco(table, tmp_path / "c", FoCoTrainConfig(**{**base.__dict__, "negative_groups": -1}))


def test_background_dropout_zeroes_whole_backgrounds_in_training_only():
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, background_dropout=0.5))
    comp = model.comp
    T, N, L, D = 3, 40, 5, 16
    v, bg = torch.randn(T, N, 1, D)[:, :, 0], torch.randn(T, N, D)
    tokens, mask = torch.randn(T, L, D), torch.ones(T, L, dtype=torch.bool)
    comp.eval()
    ref = comp(v, bg, tokens, mask)
    zero = comp(v, torch.zeros_like(bg), tokens, mask)
    assert not torch.allclose(ref, zero)
    comp.train()
    torch.manual_seed(1)
    out = comp(v, bg, tokens, mask)
    # the twin: each query's output is either the full one or the zero-background one, and both occur
    full = torch.isclose(out, ref, atol=1e-5).all(-1)
    dropped = torch.isclose(out, zero, atol=1e-5).all(-1)
    assert bool((full | dropped).all()) and full.any() and dropped.any()
    assert 0.3 < dropped.float().mean() < 0.7
    with pytest.raises(ValueError, match="background_dropout"):
        ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, background_dropout=1.0))


def test_focus_in_context_swaps_a_seeded_share_of_pairs_and_leaves_the_table_alone():
    from foco.train.foco import with_focus_in_context
    table = _table(200)
    before = table.context_idx.clone()
    out = with_focus_in_context(table, 0.3, seed=5)
    assert torch.equal(table.context_idx, before)  # the input table is not changed
    exists = table.local_idx >= 0
    swapped = (out.context_idx != before) & exists
    kept = out.context_idx == before
    # the twin: every existing pair either keeps its context or takes its own local caption as its context
    for i in range(table.local_idx.shape[0]):
        for k in range(table.local_idx.shape[1]):
            if exists[i, k]:
                assert int(out.context_idx[i, k]) in (int(before[i, k]), int(table.local_idx[i, k]))
    assert bool((kept | swapped).all())
    assert 0.2 < swapped.sum().item() / exists.sum().item() < 0.4
    assert torch.equal(with_focus_in_context(table, 0.3, seed=5).context_idx, out.context_idx)  # seeded
    assert torch.equal(out.local_idx, table.local_idx) and out.image_global is table.image_global
    b = out.batch(torch.arange(8))
    ref = table.batch(torch.arange(8))
    assert torch.equal(b.local, ref.local)
    with pytest.raises(ValueError, match="--focus-in-context"):
        train_foco(table, "/nonexistent/unused", FoCoTrainConfig(focus_in_context=1.5))


def test_focus_in_context_never_swaps_in_a_local_caption_without_tokens(capsys):
    """A training cache stores token features for contextual captions only: a local caption that is never a
    context has none, and swapping it in would leave F_Comp an empty context. Those pairs keep theirs, and it is
    said; a cache where no local caption has tokens is refused."""
    from foco.train.foco import with_focus_in_context
    table = _table(100)
    tokenless = table.local_idx[:, 0]  # every image's first local caption: no tokens in this copy of the cache
    table.text_mask = table.text_mask.clone()
    table.text_mask[tokenless] = False
    out = with_focus_in_context(table, 1.0, seed=0)
    assert torch.equal(out.context_idx[:, 0], table.context_idx[:, 0])  # kept
    assert torch.equal(out.context_idx[:, 1:], table.local_idx[:, 1:])  # the others all swapped at share 1
    assert "100 drawn pairs keep theirs" in capsys.readouterr().out
    table.text_mask[:] = False
    with pytest.raises(ValueError, match="no local caption of this feature cache has token features"):
        with_focus_in_context(table, 0.5, seed=0)


@pytest.mark.parametrize("change, match", [
    ({"negative_groups": 1}, "negative_groups must be 0"),
    ({"negative_groups": 9}, "negative_groups must be 0"),  # more than the batch of 8
    ({"model": FoCoConfig(heads=2, background_dropout=0.5, comp_layers="linear")}, "--background-dropout"),
    ({"allow_changed": ("param-groups",)}, "--allow-changed param_groups"),
])
def test_lever_settings_that_cannot_work_are_refused_by_name(tmp_path, change, match):
    cfg = FoCoTrainConfig(**{**FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=8,
                                               model=FoCoConfig(heads=2)).__dict__, **change})
    with pytest.raises(ValueError, match=match):
        train_foco(_table(), tmp_path / "run", cfg)
