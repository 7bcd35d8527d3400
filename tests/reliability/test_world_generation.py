"""Reliability (issue 13, finding 2): a world regenerated into an interrupted folder with another seed or size is
refused; it used to keep the images on disk under the new manifests and mix two worlds."""
from __future__ import annotations

import pytest

from foco.world import generate as gen
from foco.world.generate import generate_world, world_config


@pytest.mark.slow
def test_an_interrupted_world_resumes_only_with_its_own_config(tmp_path, monkeypatch):
    out = tmp_path / "tw"
    real = gen.progress

    def killed_after(items, **kw):  # the first run dies after 40 images, as a kill would leave it
        for n, x in enumerate(real(items, **kw)):
            if n == 40:
                raise KeyboardInterrupt
            yield x

    monkeypatch.setattr(gen, "progress", killed_after)
    with pytest.raises(KeyboardInterrupt):
        generate_world(out, world_config("tiny", seed=0), workers=1)
    monkeypatch.setattr(gen, "progress", real)
    assert not (out / "world.json").exists() and any((out / "images").rglob("*.png"))
    with pytest.raises(FileExistsError, match=r"interrupted world generated with another config \(seed 0\)"):
        generate_world(out, world_config("tiny", seed=1), workers=1)
    summary = generate_world(out, world_config("tiny", seed=0), workers=1)  # the same config finishes it
    assert summary["config"]["seed"] == 0 and not (out / gen.IN_PROGRESS).exists()
    fresh = generate_world(tmp_path / "fresh", world_config("tiny", seed=0), workers=1)
    assert fresh["counts"] == summary["counts"]
    for png in sorted((tmp_path / "fresh" / "images").rglob("*.png"))[:200]:  # the resumed images are the same
        assert png.read_bytes() == (out / png.relative_to(tmp_path / "fresh")).read_bytes()
