"""Backbones: the `Backbone` protocol and its implementations, behind a small registry.

    create_backbone("hf:openai/clip-vit-large-patch14")   # transformers CLIP / SigLIP, local dir or HF cache
    create_backbone("world:runs/world-backbone")           # the embedded world's backbone
"""
from __future__ import annotations

from ..registry import Registry
from .base import Backbone, ImageFeatures, TextFeatures

BACKBONES = Registry("backbone")  # kind -> factory(arg, device=...) -> Backbone
BACKBONES.register("hf", "foco.backbones.hf:HFBackbone")
BACKBONES.register("world", "foco.backbones.world:load_world_backbone")


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


__all__ = ["BACKBONES", "Backbone", "ImageFeatures", "TextFeatures", "create_backbone", "list_backbones"]
