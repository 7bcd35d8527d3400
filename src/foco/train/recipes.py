"""The training recipes on the embedded world, shared by `foco quickstart` and `foco ablate`: the world-sized
settings of FoCo's two stages (`quickstart_plan`), foco-edits' plan (`EditPlan`), and the two steps of foco-edits:
its ITT triplets (`edit_triplets`) and its third stage resumed from a paper-recipe run (`train_stage3`).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..model import FoCoConfig
from .foco import FoCoTrainConfig, train_foco
from .world_backbone import BackboneTrainConfig

log = logging.getLogger(__name__)


@dataclass
class EditPlan:
    """foco-edits in the demo: rule-written triplets from the first `sources` training captions, then stage 3."""

    sources: int | None = None  # None: every training caption
    per_caption: int = 1
    max_negatives: int = 1  # negative captions encoded and used per triplet (the first is the unedited caption)
    stage3_epochs: int = 6
    lr_edit: float = 1e-3
    image_weight: float = 0.3  # the retrieved target image's term (threshold "auto"); 0: captions only


@dataclass
class QuickstartPlan:
    size: str
    backbone: BackboneTrainConfig
    foco: FoCoTrainConfig
    edits: EditPlan = field(default_factory=EditPlan)
    benchmark_split: str = "test"
    figures: int = 6


def quickstart_plan(size: str) -> QuickstartPlan:
    """World-sized settings. The paper's recipe (lr 5e-4, then 5e-5/3e-5, batch 512, 3 + 30 epochs) is for CC3M
    with ViT-L/14; the world has 10k pairs and 2 CPU cores, so fewer, larger steps and at most 31 negatives per
    anchor. The learnable sigmoid bias is on: without it FoCo collapses on the world (docs/benchmarks.md)."""
    if size == "tiny":
        return QuickstartPlan(
            size, BackboneTrainConfig(epochs=8, batch_size=64),
            FoCoTrainConfig(stage1_epochs=2, stage2_epochs=4, batch_size=64, lr_stage1=1e-3, lr_aggr=5e-4,
                            lr_comp=5e-4, max_negatives=31, model=FoCoConfig(learn_bias=True)),
            EditPlan(per_caption=2, stage3_epochs=4))
    return QuickstartPlan(
        size, BackboneTrainConfig(epochs=6, batch_size=256),
        FoCoTrainConfig(stage1_epochs=2, stage2_epochs=3, batch_size=128, lr_stage1=1e-3, lr_aggr=3e-4,
                        lr_comp=3e-4, max_negatives=31, model=FoCoConfig(learn_bias=True)),
        EDIT_PLAN_DEFAULT)


EDIT_PLAN_DEFAULT = EditPlan(sources=5000, per_caption=1, max_negatives=1, stage3_epochs=9, lr_edit=1e-3,
                             image_weight=0.3)


def edit_triplets(store: Path, texts: Path, train_features: Path, decompositions: dict, backbone, ep: EditPlan,
                  ids: list[str], precision: str = "fp32"):
    """The EditTable of foco-edits: rule-written ITT triplets of the first `ep.sources` captions of `ids` (into
    `store`), their texts encoded once (into `texts`), joined with `train_features`; with the retrieved target
    images when `ep.image_weight` > 0. Every step resumes."""
    from ..edits.rule import RuleWriter
    from ..edits.run import GenerateConfig, run_generate
    from ..edits.store import EditStore
    from .sources import training_data
    sources = [(i, decompositions[i]) for i in ids if i in decompositions][:ep.sources]
    stats = run_generate(sources, RuleWriter("train"), store, GenerateConfig(per_caption=ep.per_caption))
    with EditStore(store) as st:
        records = st.records(stats.settings_id)
    table = training_data(train_features).edit_table(backbone, records, texts, max_negatives=ep.max_negatives,
                                                     precision=precision)
    if ep.image_weight > 0:
        table, match = table.with_targets("auto")
        log.info(match.summary())
    return table


def train_stage3(pairs, foco_dir: Path, edits_dir: Path, cfg: FoCoTrainConfig, ep: EditPlan, edits,
                 backbone_spec: str, meta: dict | None = None) -> None:
    """foco-edits from a finished paper-recipe run in `foco_dir`: its folder copied to `edits_dir` (once), then
    resumed into the edit stage with `cfg` (the paper run's settings) and the plan's stage-3 settings."""
    if not (edits_dir / "train_state").exists():
        shutil.rmtree(edits_dir, ignore_errors=True)
        shutil.copytree(foco_dir, edits_dir)
    cfg = replace(cfg, stage3_epochs=ep.stage3_epochs, lr_edit_aggr=ep.lr_edit, lr_edit_comp=ep.lr_edit,
                  image_weight=ep.image_weight)
    train_foco(pairs, edits_dir, cfg, resume=True, meta={"backbone": backbone_spec, **(meta or {})}, edits=edits)
