import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The `tiny` world, generated once per test session through the CLI."""
    from foco.cli import main
    out = tmp_path_factory.mktemp("world") / "tiny"
    assert main(["world", "generate", "--out", str(out), "--size", "tiny"]) == 0
    return out
