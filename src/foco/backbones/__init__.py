"""Backbones: the `Backbone` protocol and its implementations, behind a small registry.

    create_backbone("hf:openai/clip-vit-large-patch14")   # transformers CLIP / SigLIP, local dir or HF cache
    create_backbone("world:runs/world-backbone")           # the embedded world's backbone
"""
from __future__ import annotations

from typing import Callable

from .base import Backbone, ImageFeatures, TextFeatures


def _hf(arg: str, device: str) -> Backbone:
    from .hf import HFBackbone
    return HFBackbone(arg, device=device)


def _world(arg: str, device: str) -> Backbone:
    from .world import load_world_backbone
    return load_world_backbone(arg, device=device)


_REGISTRY: dict[str, Callable[[str, str], Backbone]] = {"hf": _hf, "world": _world}


def list_backbones() -> list[str]:
    return sorted(_REGISTRY)


def create_backbone(spec: str, device: str = "cpu") -> Backbone:
    """Builds a backbone from "KIND:ARG", e.g. "hf:PATH_OR_ID" or "world:PATH"."""
    kind, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise ValueError(f"backbone spec {spec!r} must look like KIND:ARG with KIND in {list_backbones()}")
    if kind not in _REGISTRY:
        raise ValueError(f"unknown backbone kind {kind!r} in {spec!r}; known: {list_backbones()}")
    return _REGISTRY[kind](arg, device)


__all__ = ["Backbone", "ImageFeatures", "TextFeatures", "create_backbone", "list_backbones"]
