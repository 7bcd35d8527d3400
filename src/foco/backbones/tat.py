"""`tat:PATH`: a backbone whose image tower carries SlerpTAT's text-anchored tuning (Jang et al., ECCV 2024).

Text-anchored tuning (TAT) trains LoRA adapters on the image tower's attention projections so that an image's
global moves toward the frozen text tower's feature of its caption (`foco.train.tat`, `foco tat train`). The
folder it writes holds

    tat.safetensors   per tuned Linear of the vision tower, `<name>.lora_A` (r, in) and `<name>.lora_B` (out, r)
    tat.json          the base backbone ({"spec", "weights_sha256"}), the LoRA settings (rank, alpha, targets),
                      the adapters' sha256, the tuned backbone's own record and the training settings

`create_backbone("tat:PATH")` builds the base backbone the record names, refuses one whose weights differ from
those it was tuned on, and merges each adapter into its Linear (W <- W + alpha / r * B A). The result is the base
backbone with a tuned image tower and its text tower untouched; its spec is `tat:PATH` and its weights sha256
covers the base's and the adapters', so feature caches, indexes and trained methods made with it record the tuned
backbone, and `check_same_backbone` refuses them beside the untuned base's (and the reverse), naming both.

Loading merges by hand (torch alone); training injects the adapters with peft (`foco[lora]`), and a test checks
that the merged weights give peft's features.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

ADAPTER, RECORD = "tat.safetensors", "tat.json"


def vision_tower(backbone) -> torch.nn.Module:
    """The transformer image tower of `backbone` that TAT tunes: a transformers vision model (`world:` ViT, `hf:`
    CLIP or SigLIP). A CNN world backbone has none: refused, naming the ViT one."""
    model = getattr(backbone, "model", None)
    image = getattr(model, "image", None)
    if image is not None:  # a world backbone
        clip = getattr(image, "clip", None)
        if clip is None:
            raise ValueError(f"{backbone.spec} has a CNN image tower; text-anchored tuning puts LoRA on a "
                             "transformer's attention: use a ViT backbone (--backbone world:vit, or hf:PATH)")
        return clip.vision_model
    vision = getattr(model, "vision_model", None)
    if vision is None:
        raise ValueError(f"{getattr(backbone, 'spec', backbone)} has no transformers vision model to tune")
    return vision


def target_names(vision: torch.nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The Linear modules of `vision` whose last name part is one of `targets`, in module order."""
    linears = [n for n, m in vision.named_modules() if isinstance(m, torch.nn.Linear)]
    names = [n for n in linears if n.rsplit(".", 1)[-1] in targets]
    if not names:
        raise ValueError(f"no Linear named {', '.join(targets)} in the image tower; choose --lora-targets among "
                         f"{', '.join(sorted({n.rsplit('.', 1)[-1] for n in linears}))}")
    return names


def adapter_metadata(cfg) -> dict[str, str]:
    """What the adapter file's safetensors metadata records of a run's LoRA (the merge reads its scale from there)."""
    return {"rank": str(int(cfg.rank)), "alpha": repr(float(cfg.alpha)), "targets": ",".join(cfg.targets)}


def _scale(path: Path, meta: dict, state: dict[str, torch.Tensor]) -> float:
    """alpha / r of the adapters at `path`/tat.safetensors: from the file's metadata (covered by its sha256),
    checked against the A matrices' rank and the record."""
    from safetensors import safe_open
    with safe_open(str(path / ADAPTER), framework="pt") as f:
        md = f.metadata() or {}
    try:
        rank, alpha = int(md["rank"]), float(md["alpha"])
    except (KeyError, ValueError):
        raise ValueError(f"{path / ADAPTER}: no LoRA rank and alpha in its metadata; retune with `foco tat train`") \
            from None
    ranks = {int(v.shape[0]) for k, v in state.items() if k.endswith(".lora_A")}
    lora = meta["lora"]
    if ranks != {rank} or int(lora["rank"]) != rank or float(lora["alpha"]) != alpha:
        raise ValueError(f"{path}: the adapters are of rank {sorted(ranks)} and alpha {alpha} ({ADAPTER}), its "
                         f"{RECORD} says rank {lora['rank']} and alpha {lora['alpha']}: the record was edited; "
                         "retune with `foco tat train`")
    return alpha / rank


def combined_sha256(base_sha: str | None, adapter_sha: str) -> str:
    """The tuned backbone's weights sha256: the base's and the adapters' together."""
    return hashlib.sha256(f"{base_sha or 'unhashed'}+{adapter_sha}".encode()).hexdigest()


@torch.no_grad()
def merge_adapters(vision: torch.nn.Module, state: dict[str, torch.Tensor], scale: float, where: str) -> None:
    """W <- W + scale * B @ A for every adapter in `state` (`<name>.lora_A`, `<name>.lora_B`), in place."""
    modules = dict(vision.named_modules())
    names = sorted({k.rsplit(".", 1)[0] for k in state})
    for name in names:
        lin = modules.get(name)
        a, b = state.get(f"{name}.lora_A"), state.get(f"{name}.lora_B")
        if not isinstance(lin, torch.nn.Linear) or a is None or b is None:
            raise ValueError(f"{where}: adapter {name!r} fits no Linear of the image tower (or lacks lora_A/lora_B); "
                             "it was made for another backbone: retune it with `foco tat train`")
        if b.shape[0] != lin.out_features or a.shape[1] != lin.in_features or a.shape[0] != b.shape[1]:
            raise ValueError(f"{where}: adapter {name!r} has shapes {tuple(a.shape)}, {tuple(b.shape)} for a "
                             f"{lin.in_features} -> {lin.out_features} Linear; retune it with `foco tat train`")
        delta = scale * (b.float() @ a.float())  # (out, in)
        lin.weight.copy_((lin.weight.float() + delta.to(lin.weight.device)).to(lin.weight.dtype))


class TunedImageBackbone:
    """A base backbone whose image tower holds merged TAT adapters: every attribute is the base's, except its spec
    (`tat:PATH`) and its weights sha256 (base and adapters)."""

    def __init__(self, base, path: str, weights_sha256: str, record: dict):
        self.__dict__.update(_base=base, _path=path, weights_sha256=weights_sha256, tat=record)

    @property
    def spec(self) -> str:
        return f"tat:{self._path}"

    def __getattr__(self, name: str):
        if "_base" not in self.__dict__:  # a copy being built: no base yet
            raise AttributeError(name)
        return getattr(self.__dict__["_base"], name)


def read_record(path: Path) -> dict:
    """`path`/tat.json, checked against its schema (`foco.records`), with messages naming the file and the command
    that writes it."""
    from ..records import read
    rec = path / RECORD
    if not rec.is_file() or not (path / ADAPTER).is_file():
        raise FileNotFoundError(f"no text-anchored tuning at {path}: expected {RECORD} and {ADAPTER} "
                                "(written by `foco tat train`)")
    meta = read(RECORD, rec)
    if meta["base"]["spec"].startswith("tat:"):
        raise ValueError(f"{rec}: its base {meta['base']['spec']} is itself a tuned backbone; retune with "
                         "`foco tat train`")
    return meta


def load_tat_backbone(path: str | Path, device: str | torch.device = "cpu") -> TunedImageBackbone:
    """The backbone of a `foco tat train` folder: its base with the adapters merged (module docstring)."""
    from safetensors.torch import load_file
    from . import check_same_backbone, create_backbone
    from ..utils.io import sha256_file
    path = Path(os.path.expanduser(str(path)))
    meta = read_record(path)
    sha = sha256_file(path / ADAPTER)
    if sha != meta["adapter_sha256"]:
        raise ValueError(f"{path / ADAPTER}: sha256 {sha[:12]}... differs from the {meta['adapter_sha256'][:12]}... "
                         f"its {RECORD} records: the file changed since training; retune with `foco tat train`")
    base_rec = meta["base"]
    base = create_backbone(base_rec["spec"], device=device)
    check_same_backbone(base, f"the base backbone {base_rec['spec']} now", base_rec,
                        f"the one {path} was tuned on", "retune on this backbone with `foco tat train`")
    state = load_file(str(path / ADAPTER))
    merge_adapters(vision_tower(base), state, _scale(path, meta, state), str(path / ADAPTER))
    return TunedImageBackbone(base, str(path.resolve()), combined_sha256(getattr(base, "weights_sha256", None), sha),
                              meta)
