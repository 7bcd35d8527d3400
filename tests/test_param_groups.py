"""Issue 54, item 1: the loss's temperature and bias trained as SigLIP trains them. Under --param-groups siglip
(the default) tau and b sit in their own optimiser group at --lr-temperature without weight decay, and no norm,
bias or query token is decayed (open_clip's rule); "legacy" keeps foco's earlier grouping. Checked on the groups
themselves, on the weights a step leaves, in a run's record, and on resuming a run saved before the rule."""
from __future__ import annotations

import json

import pytest
import torch

from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.train.data import PairTable
from foco.train.foco import FoCoTrainConfig, param_groups_of, train_foco

D, P, K, L = 16, 4, 3, 6


def _table(n: int = 32) -> PairTable:
    g = torch.Generator().manual_seed(3)
    nt = n * K
    lengths = torch.randint(2, L + 1, (nt,), generator=g)
    local = torch.arange(nt).view(n, K).clone()
    context = (local + 5) % nt
    norm = torch.nn.functional.normalize
    return PairTable(norm(torch.randn(n, D, generator=g), dim=-1), torch.randn(n, P, D, generator=g),
                     norm(torch.randn(nt, D, generator=g), dim=-1), torch.randn(nt, L, D, generator=g),
                     torch.arange(L)[None] < lengths[:, None], local, context)


def _model(learn_bias: bool = True) -> ComposedQueryEncoder:
    return ComposedQueryEncoder(FoCoConfig(dim=D, heads=2, learn_bias=learn_bias))


def _temps(model: ComposedQueryEncoder, stage: int) -> set[int]:
    names = ["log_scale_aggr", "bias_aggr"] + (["log_scale_comp", "bias_comp"] if stage == 2 else [])
    return {id(getattr(model, n)) for n in names}


@pytest.mark.parametrize("stage", [1, 2])
def test_siglip_groups_temperatures_apart_and_decays_only_matrices(stage):
    model = _model()
    cfg = FoCoTrainConfig(lr_stage1=1e-3, lr_aggr=2e-4, lr_comp=3e-4, weight_decay=0.05, lr_temperature=0.05)
    groups = param_groups_of(model, cfg, stage)
    seen = [id(p) for g in groups for p in g["params"]]
    modules = [model.aggr] + ([model.comp] if stage == 2 else [])
    expected = {id(p) for m in modules for p in m.parameters()} | _temps(model, stage)
    assert len(seen) == len(set(seen)) and set(seen) == expected  # every trainable parameter exactly once
    temp_group = next(g for g in groups if g["name"] == "temperatures and biases")
    assert {id(p) for p in temp_group["params"]} == _temps(model, stage)
    assert temp_group["lr"] == 0.05 and temp_group["weight_decay"] == 0.0
    for g in groups:
        for p in g["params"]:
            # open_clip's rule: a tensor of fewer than 2 dims (norm, bias, token, tau, b) is never decayed
            assert (g["weight_decay"] == 0.05) == (p.ndim >= 2), (g["name"], tuple(p.shape))
    assert id(model.comp.query_token) in {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]} \
        or stage == 1
    rates = {g["name"]: g["lr"] for g in groups}
    assert rates["aggr"] == (1e-3 if stage == 1 else 2e-4)
    if stage == 2:
        assert rates["comp"] == rates["comp (norms, biases, tokens)"] == 3e-4


def test_siglip_without_a_temperature_rate_uses_the_stage_rate_and_legacy_is_as_before():
    model = _model()
    cfg = FoCoTrainConfig(lr_stage1=1e-3, lr_comp=3e-4)
    for stage, rate in ((1, 1e-3), (2, 3e-4)):
        temp_group = next(g for g in param_groups_of(model, cfg, stage) if g["name"] == "temperatures and biases")
        assert temp_group["lr"] == rate
    legacy = param_groups_of(model, FoCoTrainConfig(param_groups="legacy", lr_aggr=2e-4, lr_comp=3e-4), 2)
    assert [g["name"] for g in legacy] == ["aggr", "comp"]
    assert all(g["weight_decay"] == 0.05 for g in legacy)
    assert _temps(model, 2) <= {id(p) for p in legacy[1]["params"]}
    assert legacy[1]["lr"] == 3e-4


def test_a_fixed_bias_stays_out_of_every_group():
    model = _model(learn_bias=False)
    ids = {id(p) for g in param_groups_of(model, FoCoTrainConfig(), 2) for p in g["params"]}
    assert id(model.bias_aggr) not in ids and id(model.bias_comp) not in ids


def test_a_step_decays_matrices_but_not_norms_or_the_temperature():
    """With zero gradients AdamW's update is the decay alone: under siglip the matrices shrink and every 1-D tensor
    stays; under legacy every tensor shrinks."""
    for rule, one_d_moves in (("siglip", False), ("legacy", True)):
        model = _model()
        cfg = FoCoTrainConfig(param_groups=rule, weight_decay=0.5, lr_comp=0.1, lr_aggr=0.1)
        opt = torch.optim.AdamW(param_groups_of(model, cfg, 2), betas=(0.9, 0.98))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        for n, p in model.named_parameters():
            if not p.requires_grad or not before[n].abs().sum():
                continue
            moved = not torch.equal(p.detach(), before[n])
            assert moved == (p.ndim >= 2 or one_d_moves), (rule, n)


def test_the_run_records_the_rule_and_the_temperature_moves_at_its_own_rate(tmp_path):
    table = _table()
    slow = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=8, lr_stage1=1e-4, lr_aggr=1e-4,
                           lr_comp=1e-4, warmup_frac=0.0, model=FoCoConfig(heads=2, learn_bias=True))
    fast = FoCoTrainConfig(**{**slow.__dict__, "lr_temperature": 0.1})
    moved = {}
    for name, cfg in (("slow", slow), ("fast", fast)):
        model = train_foco(table, tmp_path / name, cfg)
        moved[name] = abs(model.bias_comp.item() + 10.0)
        meta = json.loads((tmp_path / name / "foco.json").read_text())
        assert meta["train"]["param_groups"] == "siglip"
        assert meta["train"]["lr_temperature"] == cfg.lr_temperature
        assert meta["train"]["model.init_temperature"] == 0.1 and meta["train"]["model.init_bias"] == -10.0
        log = [json.loads(x) for x in (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
        assert any("bias_comp" in r for r in log) and any("tau_comp" in r for r in log)
    assert moved["fast"] > 20 * moved["slow"], moved


def test_a_run_saved_before_the_rule_resumes_only_as_legacy(tmp_path):
    """A training state whose recorded settings predate `param_groups` trained under the legacy grouping: resuming
    it under siglip would change the optimiser's groups, and is refused by name."""
    table = _table()
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=2, batch_size=8, param_groups="legacy",
                          model=FoCoConfig(heads=2), allow_changed=("stage2_epochs",))
    out = tmp_path / "old"
    train_foco(table, out, FoCoTrainConfig(**{**cfg.__dict__, "stage2_epochs": 1}))  # then two: it resumes
    # rewrite the saved settings as a run from before issue 54 wrote them: without the two new fields
    state = out / "train_state" / "state.json"
    raw = json.loads(state.read_text())
    for key in ("param_groups", "lr_temperature"):
        del raw["progress"]["settings"]["start"][key]
    state.write_text(json.dumps(raw))
    siglip = FoCoTrainConfig(**{**cfg.__dict__, "param_groups": "siglip"})
    with pytest.raises(ValueError, match="param_groups='legacy' \\(now 'siglip'\\)"):
        train_foco(table, out, siglip, resume=True)
    train_foco(table, out, cfg, resume=True)  # as legacy it continues
