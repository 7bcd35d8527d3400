"""TSCIR, from mapping to composing (seeds/tscir-mapping-to-composing.txt), in two stages.

Stage 1, mapping: a mapper with visual semantic injection (`foco.methods.composer.VSIMapper`: the global feature's
pseudo token attends over the patch features) is trained on the corpus images with the frozen text tower:

    L_map  = Pic2Word's symmetric InfoNCE between the images v and f_text("a photo of *" | * = phi(v, patches))
    L_soft = KL(p_b || q_b), the soft text alignment: p_b = softmax_j(c_b . c_j / tau_s) over the batch's captions
             (a caption's similarity to the others), q_b = softmax_j(t_b . c_j / tau) for the pseudo-word prompt t_b;
             the prompt is pulled towards its image's caption, softly, near-duplicate captions sharing the mass
    loss   = L_map + soft_weight L_soft

Stage 2, composing: the mapper is frozen and the text tower's trainable part (LoRA on hf, the TextHead copy on the
world) is tuned on synthetic triplets (reference, instruction, target image). The target images are not rendered:
each ITT triplet's target caption is retrieved among the corpus images with a similarity threshold
(`foco.train.targets`), and triplets without an image above it are dropped; `max_triplets` keeps "a small amount".

    L_comp = symmetric InfoNCE between q = f_text~("a photo of * that {instruction}" | phi(v)) and the target images

The seed names the modules and objectives but not their forms; the forms above are the choices, and `soft_weight`
and the threshold are options.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..backbones.tunable import TextTuneConfig
from ..methods.composer import TextComposer
from ..methods.pic2word import Pic2WordConfig
from .edit_data import EditTable
from .loop import Losses, LoopConfig, Phase, refuse_overwrite, run
from .pact import build_composer
from .pic2word import backbone_temperature, pic2word_loss
from .targets import TargetMatch


@dataclass
class TSCIRTrainConfig:
    stage1_epochs: int = 3
    stage2_epochs: int = 3
    batch_size: int = 128
    lr_stage1: float = 1e-4  # the mapper (Pic2Word's)
    lr_stage2: float = 1e-5  # the text tower's trainable part
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    soft_weight: float = 1.0  # L_soft
    soft_temperature: float = 0.05  # tau_s of the caption-caption soft labels
    threshold: float | str = "auto"  # target-image retrieval (`foco.train.targets`)
    max_triplets: int | None = None  # None: every triplet that kept a target image
    temperature: float | None = None  # None: the backbone's own
    max_steps: int | None = None
    seed: int = 0
    model: Pic2WordConfig = field(default_factory=Pic2WordConfig)
    text: TextTuneConfig = field(default_factory=TextTuneConfig)


def soft_alignment(prompt: torch.Tensor, caption: torch.Tensor, temperature: float, soft_temperature: float
                   ) -> torch.Tensor:
    """KL(p || q) averaged over the batch; prompt and caption (B, D) normalised (module docstring)."""
    p = F.softmax(caption @ caption.t() / soft_temperature, dim=1)  # (B, B)
    log_q = F.log_softmax(prompt @ caption.t() / temperature, dim=1)  # (B, B)
    return F.kl_div(log_q, p, reduction="batchmean")


def train_tscir(edits: EditTable, backbone, out: str | Path, cfg: TSCIRTrainConfig | None = None,
                resume: bool = False, meta: dict | None = None) -> tuple[TextComposer, TargetMatch]:
    """Trains both stages; writes `out`/composer.json, mapper.safetensors, text.safetensors, targets.json (which
    triplets kept which image), the log and the loss curve. Resumable after every epoch."""
    cfg = cfg or TSCIRTrainConfig()
    out = Path(out)
    refuse_overwrite(out, resume, "pass --resume to continue it or choose another --out")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    composer = build_composer("tscir", "vsi", cfg.model, cfg.text, backbone, int(edits.image_global.shape[1]),
                              patch_dim=int(edits.patches.shape[-1]))
    tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
    images = F.normalize(edits.image_global.float(), dim=-1)  # (N, D)
    captions = F.normalize(edits.text_global.float(), dim=-1)  # (Nt, D)
    # stage 1 data: each source image once, with its caption
    first = {}
    for s, c in zip(edits.source.tolist(), edits.source_caption.tolist()):
        first.setdefault(s, c)
    img_rows = torch.tensor(list(first))  # (S,)
    cap_rows = torch.tensor(list(first.values()))  # (S,)
    # stage 2 data: triplets with a retrieved target image
    targeted, match = edits.with_targets(cfg.threshold)
    kept = targeted.subset(match.kept)
    if cfg.max_triplets is not None and len(kept) > cfg.max_triplets:
        pick = torch.from_numpy(np.random.default_rng(cfg.seed).permutation(len(kept))[:cfg.max_triplets])
        mask = torch.zeros(len(kept), dtype=torch.bool)
        mask[pick] = True
        kept = kept.subset(mask)
    if len(kept) < 2:
        raise ValueError(f"{match.summary()}: too few synthetic triplets for stage 2; lower --target-threshold")

    def mapping(idx: torch.Tensor) -> Losses:  # idx (B,) rows of img_rows
        rows = img_rows[idx]
        v, patches, c = images[rows], edits.patches[rows].float(), captions[cap_rows[idx]]  # (B, D), (B, P, D)
        t = composer.text(composer.prompts(None, len(idx)), composer.mapper(v, patches), composer.cfg.placeholder)
        out = {"map": pic2word_loss(v, t, tau)}
        if cfg.soft_weight > 0:
            out["soft"] = soft_alignment(t, c, tau, cfg.soft_temperature)
        out["loss"] = out["map"] + cfg.soft_weight * out.get("soft", 0.0)
        return out

    def composing(idx: torch.Tensor) -> Losses:  # idx (B,) rows of kept
        b = kept.batch(idx)
        q = composer(b.reference.global_, b.reference.patches, b.texts)  # (B, D)
        logits = q @ b.target_image.t() / tau  # (B, B)
        labels = torch.arange(len(idx))
        return {"loss": 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))}

    def stage1_opt() -> torch.optim.AdamW:
        composer.text.requires_grad_(False)  # the frozen text tower: only the mapper learns to map
        return torch.optim.AdamW(composer.mapper.parameters(), lr=cfg.lr_stage1, weight_decay=cfg.weight_decay)

    def stage2_opt() -> torch.optim.AdamW:
        composer.mapper.requires_grad_(False)
        for name, p in composer.text.named_parameters():
            p.requires_grad_(composer.text.cfg.kind == "world-head" or "lora_" in name)
        return torch.optim.AdamW([p for p in composer.text.parameters() if p.requires_grad], lr=cfg.lr_stage2,
                                 weight_decay=cfg.weight_decay)

    phases = [Phase(cfg.stage1_epochs, stage1_opt, mapping, tag={"stage": "mapping"}, n=len(img_rows)),
              Phase(cfg.stage2_epochs, stage2_opt, composing, tag={"stage": "composing"}, n=len(kept))]
    loop = LoopConfig(len(kept), min(cfg.batch_size, len(kept), len(img_rows)), cfg.warmup_frac, cfg.grad_clip,
                      cfg.max_steps, name="TSCIR", plot_keys=("map", "soft", "loss"),
                      plot_title="TSCIR training losses per step (mapping, then composing)",
                      identity={"backbone": backbone.spec})
    run(composer, phases, out, loop, rng, resume)
    composer.save(out, {"backbone": backbone.spec, "temperature": tau,
                        "targets": {"threshold": match.threshold, "triplets": len(edits),
                                    "with_target": int(match.kept.sum()), "trained_on": len(kept)},
                        "train": {k: v for k, v in asdict(cfg).items() if k not in ("model", "text")},
                        **(meta or {})})
    return composer, match
