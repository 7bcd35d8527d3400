"""`foco train` as one library call: the training data, the launch, the resume rule and the optional edit stage, all
as typed settings (`FoCoJob`), run in that order by `run_foco_job`. The CLI only maps its flags onto these."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .distributed import Launch, group_line, shutdown, start_run
from .foco import FoCoTrainConfig, train_foco
from .resume_rule import ResumeFlags, apply_resume_rule, check_resume_flags
from .sources import DataSpec, data_of, edit_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditStage:
    """foco-edits' third stage (not in the FoCo paper): the ITT triplets of `store` (its one generator setting, or
    `settings`), their texts encoded into `features` (None: OUT/edit-features); with `FoCoTrainConfig.image_weight`
    > 0, the target images retrieved from the corpus at `target_threshold` (a cosine or "auto")."""

    store: str
    settings: str | None = None
    features: str | None = None
    target_threshold: float | str = "auto"  # --target-threshold's text; parsed when the job is made


@dataclass(frozen=True)
class FoCoJob:
    """Everything `foco train` is told: where the run goes, FoCo's settings, what it trains on and how it starts."""

    out: str
    train: FoCoTrainConfig
    data: DataSpec
    launch: Launch = Launch()
    resume: ResumeFlags = ResumeFlags()
    edits: EditStage | None = None

    def __post_init__(self):  # what can be refused is refused when the job is made, before anything runs (the CLI
        # checks the resume flags first, to print the deprecation notes)
        check_resume_flags(self.out, self.resume, note=lambda line: None)
        if self.data.online and self.edits:
            raise ValueError("--online trains the paper's two stages (no --edits)")
        if self.edits and self.train.image_weight > 0:  # the edit stage's target images: a cosine or "auto"
            from .targets import parse_threshold
            parsed = parse_threshold(str(self.edits.target_threshold))
            object.__setattr__(self, "edits", replace(self.edits, target_threshold=parsed))


def run_foco_job(job: FoCoJob, report: Callable[[str], None] = log.info,
                 note: Callable[[str], None] = log.warning) -> bool:
    """Trains `job` (its flags were checked when it was made); True on the main rank (the one that reports). The
    training data's kind is picked once, the ranks are joined, --restart applied, the pairs (and edit triplets)
    read, then the stages trained. `report` takes what a user reads about the data (the CLI prints it): each
    rank's feature shards, the target images found for the edit stage; `note` the process group joined and what
    --restart removed."""
    data = data_of(job.data)  # the kind, chosen once
    env = start_run(job.launch, job.train.seed, job.out)  # under torchrun: the run's context, made once
    line = group_line(env)
    if line:
        note(line)
    removed = apply_resume_rule(job.out, job.resume, env)
    if removed:
        note(removed)
    cfg = replace(job.train, device=env.device,
                  stage3_epochs=job.train.stage3_epochs if job.edits else 0)
    table, sharded = data.pair_table(env, max_pairs=cfg.max_pairs)  # the decompositions are checked here, first
    if sharded:
        report(f"rank {env.rank}: {len(table)} images from feature shards {', '.join(table.parts)}")
    edits = _edit_table(job, data, env, report) if job.edits else None
    train_foco(table, job.out, cfg, resume=True, meta={"backbone": data.backbone_spec,
                                                      "provenance": data.provenance()},
               edits=edits, sharded=sharded, ctx=env)
    shutdown(env)
    return env.is_main


def _edit_table(job: FoCoJob, data, env, report: Callable[[str], None]):
    """The edit stage's table: the store's triplets (refused when written from another world), their texts encoded
    with the training data's backbone, and the retrieved target images when the image term is on."""
    from ..backbones import create_backbone
    records = edit_records(job.edits.store, job.edits.settings, world_root=job.data.world)
    edits = data.edit_table(create_backbone(data.backbone_spec, env.device), records,
                            job.edits.features or Path(job.out) / "edit-features", env)
    if job.train.image_weight > 0:
        edits, match = edits.with_targets(job.edits.target_threshold)  # parsed when the job was made
        report(match.summary())
    return edits
