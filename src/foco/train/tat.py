"""SlerpTAT's text-anchored tuning (`foco tat train`): LoRA on the image tower, toward the frozen text tower.

Jang et al. (ECCV 2024) tune the image encoder alone, with LoRA, so that an image's global moves toward the text
feature of its own caption, the text encoder frozen (tuning it too, or instead, collapses their CIRCO mAP@5 from
18.5 to about 8). The objective is the symmetric in-batch contrastive loss, summed over the two directions, at a
fixed logit scale s:

    L = CE(s * V T^T, I) + CE(s * T V^T, I),     V = normalize(E_I^LoRA(images)),  T = normalize(E_T(captions))

The public code (youngkyunJang/SLERP-TAT, 8c2fe68) holds only the slerp function, so the rest follows the paper:
rank 16, alpha 16, dropout 0.1, AdamW at lr 1e-4, batch 1024, one epoch, s = 1 / 0.07. Which Linear layers
carry LoRA the paper does not say; its "< 0.5 % of the parameters" fits the attention's query and value
projections (`q_proj`, `v_proj`, the default). Weight decay, warm-up and schedule are not given either: foco's
loop defaults (no decay on LoRA, 5 % warm-up, cosine) are recorded with the run. The adapters are saved as
`foco.backbones.tat` reads them; the tuned backbone is `tat:OUT`.

The images are read and preprocessed by DataLoader workers ahead of the steps (`prefetch`), the captions
tokenized there too; the frozen text tower encodes each batch's captions (nothing grows with the corpus).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .distributed import RunContext, context
from .harness import Plan, train_run
from .loop import RUN_ONLY, Losses, LoopConfig, Phase, recorded_settings, settings_of


@dataclass
class TATTrainConfig:
    epochs: int = 1  # the paper's
    batch_size: int = 1024  # the paper's
    lr: float = 1e-4  # the paper's
    weight_decay: float = 0.0  # not in the paper
    warmup_frac: float = 0.05  # not in the paper (foco's loop default)
    grad_clip: float = 1.0
    rank: int = 16  # the paper's
    alpha: float = 16.0  # the paper's
    dropout: float = 0.1  # the paper's
    targets: tuple[str, ...] = ("q_proj", "v_proj")  # the paper's "< 0.5 %" (module docstring)
    logit_scale: float = 1 / 0.07  # the paper's fixed temperature
    workers: int = 0  # DataLoader processes preparing batches ahead of the steps
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None
    precision: str = "fp32"
    allow_changed: tuple[str, ...] = ()


def tat_loss(image: torch.Tensor, text: torch.Tensor, scale: float) -> torch.Tensor:
    """L_I2T + L_T2I over B matched pairs; image, text (B, D) normalised."""
    logits = scale * image @ text.t()  # (B, B)
    labels = torch.arange(image.shape[0], device=image.device)
    return F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)


class Adapters(torch.nn.Module):
    """The LoRA modules peft injected into the image tower (A, B and the dropout of each tuned Linear), as one module:
    what the loop trains, checkpoints and resumes, without the frozen weights around them."""

    def __init__(self, vision: torch.nn.Module, names: Sequence[str]):
        super().__init__()
        self.names = list(names)
        modules = dict(vision.named_modules())
        self.a, self.b, self.drop = torch.nn.ModuleDict(), torch.nn.ModuleDict(), torch.nn.ModuleDict()
        for name in self.names:
            layer, key = modules[name], name.replace(".", "__")
            self.a[key], self.b[key] = layer.lora_A["default"], layer.lora_B["default"]
            self.drop[key] = layer.lora_dropout["default"]

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """`<name>.lora_A` (r, in) and `<name>.lora_B` (out, r) of every tuned Linear (`foco.backbones.tat`)."""
        out = {}
        for name in self.names:
            key = name.replace(".", "__")
            out[f"{name}.lora_A"] = self.a[key].weight.detach().float().cpu().contiguous()
            out[f"{name}.lora_B"] = self.b[key].weight.detach().float().cpu().contiguous()
        return out


def inject_lora(vision: torch.nn.Module, cfg: TATTrainConfig) -> Adapters:
    """LoRA (peft) on the `cfg.targets` Linear layers of `vision`, in place; only the adapters train."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ImportError("text-anchored tuning needs peft: pip install 'foco[lora]'") from None
    from ..backbones.tat import target_names
    names = target_names(vision, tuple(cfg.targets))
    vision.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                       target_modules=names, bias="none"), vision)
    adapters = Adapters(vision, names)
    adapters.requires_grad_(True)
    return adapters


class _Pairs(torch.utils.data.Dataset):
    """Pair i -> (the image's (3, H, W) uint8 pixels, its caption): what a worker hands back."""

    def __init__(self, sources: Sequence[Any], captions: Sequence[str], transform):
        self.sources, self.captions, self.transform = sources, captions, transform

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        from ..corpora.loader import load_source
        return self.transform(load_source(self.sources[i])), self.captions[i]


class _Collate:
    def __init__(self, text_transform):
        self.text_transform = text_transform

    def __call__(self, items: list[tuple[torch.Tensor, str]]) -> dict:
        ids, mask = self.text_transform([c for _, c in items])  # (B, L), (B, L)
        return {"pixels": torch.stack([p for p, _ in items]), "ids": ids, "mask": mask}


class PairBatches:
    """The batches of image-caption pairs, prepared by `workers` DataLoader processes in the epoch's order ahead of
    the steps (`prefetch`); with no workers, in the step (`foco.corpora.loader.AheadBatches`)."""

    def __init__(self, sources: Sequence[Any], captions: Sequence[str], backbone, workers: int, device):
        from ..corpora.loader import AheadBatches
        self.collate = _Collate(backbone.text_transform())
        self.batches = AheadBatches(_Pairs(sources, captions, backbone.image_transform()), workers, device)

    def prefetch(self, batches: list[torch.Tensor]) -> None:
        self.batches.prefetch(batches, self.collate)

    def __call__(self, idx: torch.Tensor) -> dict:
        return self.batches.take(idx, self.collate)


def train_tat(backbone_spec: str, sources: Sequence[Any], captions: Sequence[str], out: str | Path,
              cfg: TATTrainConfig | None = None, resume: bool = False, meta: dict | None = None,
              ctx: RunContext | None = None) -> dict:
    """Tunes the image tower of `backbone_spec` on the pairs (`sources[i]`, an image path or loadable source, with
    `captions[i]`) and writes `out`/tat.safetensors + tat.json (`foco.backbones.tat`); returns the record.
    The state is saved after every epoch; `resume=True` continues a killed run."""
    from safetensors.torch import save
    from ..backbones import backbone_record, canonical_spec, create_backbone
    from ..backbones.tat import ADAPTER, RECORD, adapter_metadata, combined_sha256, vision_tower
    from ..utils.io import atomic_write_bytes, atomic_write_text
    from ..utils.precision import resolve_precision
    from ..utils.provenance import provenance
    cfg = cfg if cfg is not None else TATTrainConfig()
    if len(sources) != len(captions):
        raise ValueError(f"{len(sources)} images but {len(captions)} captions")
    if backbone_spec.startswith("tat:"):
        raise ValueError(f"--backbone {backbone_spec} is already tuned; tune its base ({backbone_spec} records it)")
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    result: dict = {}

    def build(ctx: RunContext) -> Plan:
        backbone = create_backbone(backbone_spec, device=ctx.device)
        vision = vision_tower(backbone)
        adapters = inject_lora(vision, cfg).to(ctx.device)
        data = PairBatches(sources, captions, backbone, cfg.workers, ctx.device)

        def step(idx: torch.Tensor) -> Losses:  # idx (B,)
            prep = data(idx)
            image = backbone.forward_pixels(prep["pixels"]).global_  # (B, D) normalised, through the adapters
            with torch.no_grad():
                text = backbone.encode_tokens(prep["ids"], prep["mask"], device=ctx.device).global_.clone()  # (B, D)
            return {"loss": tat_loss(image.float(), text.float(), cfg.logit_scale)}

        opt = lambda: torch.optim.AdamW(adapters.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # noqa: E731
        phase = Phase(cfg.epochs, opt, step, prefetch=data.prefetch)
        loop = LoopConfig(len(sources), min(cfg.batch_size, len(sources)), cfg.warmup_frac, cfg.grad_clip,
                          cfg.max_steps, name="TAT", identity={"backbone": canonical_spec(backbone_spec)},
                          settings=settings_of(cfg, RUN_ONLY | {"workers"}),  # workers: how fast, not what
                          precision=resolve_precision(cfg.precision, ctx.device),
                          allow_changed=frozenset(cfg.allow_changed))

        def save_adapters(history: dict) -> None:
            # the scale's settings ride in the file's metadata, so the adapters' sha256 covers them too
            data_bytes = save(adapters.adapter_state(), metadata=adapter_metadata(cfg))
            atomic_write_bytes(Path(ctx.out) / ADAPTER, data_bytes)
            sha = hashlib.sha256(data_bytes).hexdigest()
            base = backbone_record(backbone)
            tuned = {"spec": f"tat:{Path(ctx.out).resolve()}",
                     "weights_sha256": combined_sha256(base["weights_sha256"], sha)}
            record = {"method": "slerp-tat", "base": base, "backbone": tuned, "adapter_sha256": sha,
                      "lora": {"rank": cfg.rank, "alpha": cfg.alpha, "dropout": cfg.dropout,
                               "targets": list(cfg.targets), "layers": len(adapters.names),
                               "parameters": sum(p.numel() for p in adapters.parameters())},
                      **recorded_settings(history), **(meta or {}), "made_by": provenance()}
            atomic_write_text(Path(ctx.out) / RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")
            result.update(record)
        return Plan(adapters, [phase], loop, save_adapters)
    train_run(ctx, build, resume)
    return result
