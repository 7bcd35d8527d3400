"""Reliability (issue 13, finding 8): FashionIQ's empty captions never become the text " and "."""
from __future__ import annotations

import pytest

from foco.benchmarks.fashioniq import join_captions


def test_an_empty_caption_is_left_out_not_joined():
    assert join_captions("is red", "", "both") == ("is red",)
    assert join_captions(" . ", "has long sleeves.", "pic2word") == ("has long sleeves",)
    assert join_captions("is red", "is longer", "both") == ("is red and is longer", "is longer and is red")
    with pytest.raises(ValueError, match="both captions are empty"):
        join_captions("", " ", "single")
