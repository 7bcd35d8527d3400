"""The val curve (issue 54: training to val convergence): a trainer's `on_epoch` scores the model after every epoch
through the one evaluation path, and the last point is what the saved checkpoint scores when evaluated afresh."""
from __future__ import annotations

import json

import pytest


def test_the_last_point_of_the_curve_is_the_checkpoints_score(tiny_world, train_features, eval_features, tmp_path):
    from foco.benchmarks.world import load_world_part
    from foco.eval.val_curve import VAL_CURVE, ValCurve
    from foco.methods import build_method
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world import load_pairs
    table = build_pair_table(train_features, {p.id: p.decomposition for p in load_pairs(tiny_world, "train")})
    # the tiny world's test parts stand in for val here (a curve built with `ValCurve.world` reads val only)
    single = load_world_part(tiny_world, "test", "single", eval_features / "test-single")
    multi = load_world_part(tiny_world, "test", "multi", eval_features / "test-multi")
    with pytest.raises(ValueError, match="R@5 is not among multi's"):
        ValCurve({"multi": multi}, None, metric="R@5").score(build_method("image"))
    curve = ValCurve({"single": single, "single again": single}, tmp_path / "run", metric="R@5")
    train_foco(table, tmp_path / "run", FoCoTrainConfig(stage1_epochs=1, stage2_epochs=2, batch_size=64),
               on_epoch=curve.foco)
    lines = [json.loads(x) for x in (tmp_path / "run" / VAL_CURVE).read_text().splitlines()]
    assert [(x["stage"], x["epoch"]) for x in lines] == [(1, 1), (2, 1), (2, 2)]
    assert lines == curve.records
    fresh = curve.score(build_method("foco", tmp_path / "run"))
    assert lines[-1]["R@5"] == fresh and set(fresh) == {"single", "single again", "mean"}
    assert fresh["mean"] == fresh["single"] == fresh["single again"]
    with pytest.raises(ValueError, match="val split"):
        ValCurve.world(tiny_world, eval_features, ("single",), None, split="test")
