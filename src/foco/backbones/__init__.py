"""Backbones: the `Backbone` protocol and its implementations, behind a small registry.

    create_backbone("hf:openai/clip-vit-large-patch14")   # transformers CLIP / SigLIP, local dir or HF cache
    create_backbone("world:vit")                           # the embedded world's ViT backbone, shipped
    create_backbone("world:pretrained")                    # the embedded world's CNN backbone, shipped
    create_backbone("world:runs/world-backbone")           # a world backbone trained with `foco backbone train`
    create_backbone("tat:runs/tat")                        # a backbone whose image tower `foco tat train` tuned
"""
from __future__ import annotations

from ..registry import Registry
from .base import Backbone, ImageFeatures, TextFeatures

SHIPPED_WORLD = ("pretrained", "vit")  # `world:NAME` backbones shipped with foco (`world.SHIPPED`)
BACKBONES = Registry("backbone")  # kind -> factory(arg, device=...) -> Backbone
BACKBONES.register("hf", "foco.backbones.hf:HFBackbone")
BACKBONES.register("world", "foco.backbones.world:load_world_backbone")
BACKBONES.register("tat", "foco.backbones.tat:load_tat_backbone")  # a base with SlerpTAT's tuned image tower


def list_backbones() -> list[str]:
    return sorted(BACKBONES.names())


def create_backbone(spec: str, device: str = "cpu") -> Backbone:
    """Builds a backbone from "KIND:ARG", e.g. "hf:PATH_OR_ID" or "world:PATH"."""
    kind, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise ValueError(f"backbone spec {spec!r} must look like KIND:ARG with KIND in {list_backbones()}")
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone kind {kind!r} in {spec!r}; known: {list_backbones()}")
    return BACKBONES.get(kind)(arg, device=device)


def canonical_spec(spec: str) -> str:
    """A spec as a backbone built from it records it, without building it: a local folder resolved (`world:PATH`,
    `hf:PATH`), a name (`world:pretrained`, a hub id) as it is. Two spellings of one backbone compare equal."""
    import os
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in BACKBONES or (kind == "world" and arg in SHIPPED_WORLD):
        return spec
    path = os.path.expanduser(arg)
    return f"{kind}:{os.path.realpath(path)}" if os.path.isdir(path) else spec


def backbone_record(backbone: Backbone) -> dict:
    """What an artifact made with `backbone` records of it: {"spec", "weights_sha256"} (None where unknown)."""
    return {"spec": backbone.spec, "weights_sha256": getattr(backbone, "weights_sha256", None)}


def as_record(recorded) -> dict:
    """A backbone as an artifact records it: a spec string (artifacts before issue 24) or {"spec",
    "weights_sha256"}; a backbone object gives its record."""
    if recorded is None:
        return {"spec": None, "weights_sha256": None}
    if isinstance(recorded, str):
        return {"spec": recorded, "weights_sha256": None}
    if isinstance(recorded, dict):
        return {"spec": recorded.get("spec"), "weights_sha256": recorded.get("weights_sha256")}
    return backbone_record(recorded)


def check_same_backbone(have, have_what: str, want, want_what: str, fix: str) -> None:
    """Refuses two artifacts (or an artifact and a backbone) made with different backbones, naming both sides and
    `fix`: their specs differ (compared resolved, `canonical_spec`), or both record weights and those differ.
    A side that records nothing is not compared."""
    a, b = as_record(have), as_record(want)
    if a["spec"] is None or b["spec"] is None:
        return
    if canonical_spec(a["spec"]) != canonical_spec(b["spec"]):
        raise ValueError(f"backbones differ: {have_what} is of {a['spec']}, {want_what} of {b['spec']}; {fix}")
    if a["weights_sha256"] and b["weights_sha256"] and a["weights_sha256"] != b["weights_sha256"]:
        raise ValueError(f"{have_what} was made with other weights of {a['spec']} (sha256 "
                         f"{a['weights_sha256'][:12]}...) than {want_what} ({b['weights_sha256'][:12]}...): the "
                         f"backbone's files changed in between; {fix}")


__all__ = ["as_record", "backbone_record", "canonical_spec", "check_same_backbone", "BACKBONES", "Backbone",
           "ImageFeatures", "TextFeatures", "create_backbone", "list_backbones"]
