"""A val curve: a trained method scored on a world's val protocols after every epoch, through the one evaluation path
(`foco.eval.compose.compose`, `foco.eval.rank.score_queries`), appended to `val_curve.jsonl` beside the run's train
log. It is what "trained to val convergence" reads (issue 54): the epoch where val R@1 stops rising.

    curve = ValCurve.world(world, features, protocols=("single", "described"), out=run_dir)
    train_foco(table, run_dir, cfg, on_epoch=curve.foco)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

VAL_CURVE = "val_curve.jsonl"


@dataclass
class ValCurve:
    """Val parts (protocol -> (benchmark, its features)), scored after each epoch into `out`/val_curve.jsonl."""

    parts: dict = field(default_factory=dict)
    out: Path | None = None
    metric: str = "R@1"
    records: list[dict] = field(default_factory=list)

    @classmethod
    def world(cls, world: str | Path, features: str | Path, protocols: tuple[str, ...], out: str | Path | None,
              split: str = "val") -> "ValCurve":
        """The world's `split` parts of `protocols`, read from the caches `features`/`split`-`protocol` (as
        `foco features extract --split split/protocol` writes them)."""
        from ..benchmarks.world import load_world_part
        if split != "val":
            raise ValueError(f"a val curve reads the val split, not {split!r}: a curve on test would select on test")
        parts = {p: load_world_part(world, split, p, Path(features) / f"{split}-{p}") for p in protocols}
        return cls(parts, None if out is None else Path(out))

    def score(self, method) -> dict[str, float]:
        """`metric` of `method` (a QueryMethod) on every part, and their mean ("mean")."""
        from ..eval.compose import compose
        from ..eval.rank import score_queries
        got = {}
        for name, (bench, feats) in self.parts.items():
            q = compose(method, bench, feats).query  # (Q, D)
            scores = score_queries(q, bench, feats.gallery_ids, feats.gallery)
            if self.metric not in scores:
                raise ValueError(f"the val curve's metric {self.metric} is not among {name}'s ({', '.join(scores)})")
            got[name] = round(scores[self.metric], 2)
        got["mean"] = round(sum(got.values()) / len(got), 2)
        return got

    def foco(self, model, rec: dict) -> None:
        """`train_foco`'s `on_epoch`: the model as it stands after the epoch `rec` logged."""
        from ..methods.foco import FoCoMethod
        with torch.inference_mode():
            got = self.score(FoCoMethod(model))
        line = {k: rec[k] for k in ("stage", "epoch") if k in rec}
        line.update({"loss": rec.get("loss"), self.metric: got})
        self.records.append(line)
        if self.out is not None:
            with open(self.out / VAL_CURVE, "a") as f:
                f.write(json.dumps(line) + "\n")
