"""Reliability (issue 13, finding 8): atomically written files follow the umask like any other file (they were
0600 whatever the umask)."""
from __future__ import annotations

import os
import stat

from foco.utils.io import atomic_write_text


def test_atomic_writes_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600
    assert (tmp_path / "a.json").read_text() == "{}" and not list(tmp_path.glob(".*.tmp"))
