"""`foco train` as one library call: the training data, the launch, the resume rule and the optional edit stage, all
as typed settings (`FoCoJob`), run in that order by `run_foco_job`. The CLI only maps its flags onto these."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .distributed import Launch, shutdown, start_run
from .foco import FoCoTrainConfig, train_foco
from .resume_rule import ResumeFlags, apply_resume_rule, check_resume_flags
from .sources import DataSpec, data_of, edit_records


@dataclass(frozen=True)
class EditStage:
    """foco-edits' third stage (not in the FoCo paper): the ITT triplets of `store` (its one generator setting, or
    `settings`), their texts encoded into `features` (None: OUT/edit-features); with `FoCoTrainConfig.image_weight`
    > 0, the target images retrieved from the corpus at `target_threshold` (a cosine or "auto")."""

    store: str
    settings: str | None = None
    features: str | None = None
    target_threshold: float | str = "auto"

    def __post_init__(self):  # refused when the job is made, before anything runs
        from .targets import parse_threshold
        object.__setattr__(self, "target_threshold", parse_threshold(str(self.target_threshold)))


@dataclass(frozen=True)
class FoCoJob:
    """Everything `foco train` is told: where the run goes, FoCo's settings, what it trains on and how it starts."""

    out: str
    train: FoCoTrainConfig
    data: DataSpec
    launch: Launch = Launch()
    resume: ResumeFlags = ResumeFlags()
    edits: EditStage | None = None

    def __post_init__(self):  # what can be refused is refused when the job is made, before anything runs
        check_resume_flags(self.out, self.resume)
        if self.data.online and self.edits:
            raise ValueError("--online trains the paper's two stages (no --edits)")


def run_foco_job(job: FoCoJob) -> bool:
    """Trains `job` (its flags were checked when it was made); True on the main rank (the one that reports). The
    training data's kind is picked once, the ranks are joined, --restart applied, the pairs (and edit triplets)
    read, then the stages trained."""
    data = data_of(job.data)  # the kind, chosen once
    env = start_run(job.launch, job.train.seed, job.out)  # under torchrun: the run's context, made once
    apply_resume_rule(job.out, job.resume, env)
    cfg = replace(job.train, device=env.device,
                  stage3_epochs=job.train.stage3_epochs if job.edits else 0)
    table, sharded = data.pair_table(env, max_pairs=cfg.max_pairs)  # the decompositions are checked here, first
    if sharded:
        print(f"rank {env.rank}: {len(table)} images from feature shards {', '.join(table.parts)}", flush=True)
    edits = _edit_table(job, data, env) if job.edits else None
    train_foco(table, job.out, cfg, resume=True, meta={"backbone": data.backbone_spec,
                                                      "provenance": data.provenance()},
               edits=edits, sharded=sharded, ctx=env)
    shutdown(env)
    return env.is_main


def _edit_table(job: FoCoJob, data, env):
    """The edit stage's table: the store's triplets (refused when written from another world), their texts encoded
    with the training data's backbone, and the retrieved target images when the image term is on."""
    from ..backbones import create_backbone
    records = edit_records(job.edits.store, job.edits.settings, world_root=job.data.world)
    edits = data.edit_table(create_backbone(data.backbone_spec, env.device), records,
                            job.edits.features or Path(job.out) / "edit-features", env)
    if job.train.image_weight > 0:
        edits, match = edits.with_targets(job.edits.target_threshold)
        print(match.summary(), file=sys.stdout)
    return edits
