"""The simple baselines, which need no training: the reference image alone and the normalised sum of image and
text (the "image + text" late fusion of the ZS-CIR literature). The text alone is `text_only.py`."""
from __future__ import annotations

import torch.nn.functional as F

from ..model.encoder import ComposedQuery
from .base import QueryBatch, QueryMethod, plain_query


class ImageOnly(QueryMethod):
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        return plain_query(batch.reference.global_)  # (B, D)


class ImageTextSum(QueryMethod):
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        v, t = batch.reference.global_, batch.modification.global_  # (B, D) each
        return plain_query(F.normalize(v, dim=-1) + F.normalize(t, dim=-1))
