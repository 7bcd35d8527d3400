"""FoCo's module shapes (issue 39): the paper-size default has the paper's 38M trainable parameters at D = 768,
the compact shape stays selectable, and a checkpoint written before the shape fields loads as compact."""
import json

import pytest
import torch

from foco.model.encoder import (SHAPES, ComposedQueryEncoder, FoCoConfig, config_from_dict, shape_fields,
                                shape_of)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_paper_shape_has_38m_parameters_at_vit_l14_width():
    model = ComposedQueryEncoder(FoCoConfig(dim=768))  # the default shape
    assert shape_of(model.cfg) == "paper"
    n = model.num_trainable()
    assert n == 38_390_016  # docs/architecture.md, "FoCo's size": F_Aggr 14,174,976 + F_Comp 24,215,040
    assert abs(n / 38e6 - 1) <= 0.05  # the paper: "FoCo trains 38M parameters"
    assert _count(model.aggr) == 14_174_976 and _count(model.comp) == 24_215_040


def test_compact_shape_is_the_old_23m():
    model = ComposedQueryEncoder(FoCoConfig(dim=768, **shape_fields("compact")))
    assert shape_of(model.cfg) == "compact"
    assert model.num_trainable() == 23_041_536


def test_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="paper, compact"):
        shape_fields("huge")


def test_old_checkpoint_config_loads_as_compact(tmp_path):
    """A checkpoint saved before the shape fields existed: its weights load into the compact shape, unchanged."""
    compact = ComposedQueryEncoder(FoCoConfig(dim=32, heads=4, **shape_fields("compact")))
    compact.save(tmp_path)
    meta = json.loads((tmp_path / "foco.json").read_text())
    for k in ("aggr_block_ffn_ratio", "aggr_ffn_ratio", "map_mlp_ratio"):
        del meta["config"][k]  # as an old foco wrote it
    (tmp_path / "foco.json").write_text(json.dumps(meta))
    loaded = ComposedQueryEncoder.load(tmp_path)
    assert shape_of(loaded.cfg) == "compact"
    for k, v in compact.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_old_config_keeps_its_own_ffn_width():
    """Before the split, aggr_mlp_ratio set both the query MLP and the feed-forward projection."""
    cfg = config_from_dict({"dim": 32, "heads": 4, "aggr_mlp_ratio": 3.0})
    assert cfg.aggr_ffn_ratio == 3.0 and cfg.aggr_block_ffn_ratio == 0.0 and cfg.map_mlp_ratio == 0.0


def test_paper_checkpoint_round_trips_and_differs_from_compact(tmp_path):
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=32, heads=4))
    model.save(tmp_path)
    loaded = ComposedQueryEncoder.load(tmp_path)
    assert shape_of(loaded.cfg) == "paper" and set(loaded.state_dict()) == set(model.state_dict())
    assert "aggr.block_ffn.1.weight" in loaded.state_dict() and "comp.f_t.2.weight" in loaded.state_dict()
    assert set(SHAPES) == {"paper", "compact"}


def test_unknown_config_field_is_refused():
    with pytest.raises(ValueError, match="unknown fields"):
        config_from_dict({"dim": 32, "aggr_block_ffn_ratio": 4.0, "aggr_ffn_ratio": 4.0, "map_mlp_ratio": 4.0,
                          "depth_of_field": 3})
