"""An older commit's code beside today's, for benchmarks that measure both in one run: a detached git worktree in
a temporary folder, removed when the process exits."""
from __future__ import annotations

import atexit
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check_out(ref: str, prefix: str = "foco-old-") -> Path:
    """The `src` folder of commit `ref`, checked out into a fresh temporary worktree (put it on PYTHONPATH)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix)) / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True,
                   capture_output=True)
    atexit.register(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
                    check=False, capture_output=True)
    return folder / "src"
