"""The modification text alone: the query is the text's global feature, the reference image is ignored."""
from __future__ import annotations

from ..model.encoder import ComposedQuery
from .base import QueryBatch, QueryMethod, plain_query


class TextOnly(QueryMethod):
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        return plain_query(batch.modification.global_)  # (B, D)
