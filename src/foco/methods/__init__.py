"""Compared methods of the field beyond `foco.baselines`: Pic2Word (pseudo word) and slerp (SlerpTAT's fusion).

Methods with `needs_backbone = True` (Pic2Word) compose from raw modification text with the backbone's text tower:
see `foco.methods.raw`. Chord rescoring (any method) is `foco.chord`; box anchoring (FoCo) is `foco.box`.
"""
from .pic2word import Pic2WordConfig, Pic2WordMapper, Pic2WordMethod, Pic2WordTrainConfig, train_pic2word
from .raw import compose_raw, compose_raw_queries, needs_backbone
from .slerp import SlerpMethod, choose_alpha, slerp

__all__ = ["Pic2WordConfig", "Pic2WordMapper", "Pic2WordMethod", "Pic2WordTrainConfig", "train_pic2word",
           "compose_raw", "compose_raw_queries", "needs_backbone", "SlerpMethod", "choose_alpha", "slerp"]
