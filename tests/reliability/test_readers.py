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


def _export(world, fmt, out):
    from foco.benchmarks.export import export_world
    export_world(world, fmt, "val", out)
    return out


def test_cirr_target_hard_as_a_list_is_refused_by_name(tiny_world, tmp_path):
    """Finding 8: CIRR `target_hard` as a list gave a TypeError; now a ManifestError naming the file and pair."""
    import json
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    root = _export(tiny_world, "cirr", tmp_path / "cirr")
    cap = root / "captions" / "cap.rc2.val.json"
    entries = json.loads(cap.read_text())
    entries[0]["target_hard"] = [entries[0]["target_hard"]]
    cap.write_text(json.dumps(entries))
    with pytest.raises(ManifestError, match=rf"cap.rc2.val.json.*target_hard.*{entries[0]['pairid']}"):
        read_benchmark("cirr", root, "val")


def test_circo_integer_file_name_is_refused_by_name(tiny_world, tmp_path):
    """Finding 8: a CIRCO integer `file_name` gave a TypeError; now a ManifestError naming the file and image id."""
    import json
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    root = _export(tiny_world, "circo", tmp_path / "circo")
    info = next(root.rglob("image_info_unlabeled2017.json"))
    data = json.loads(info.read_text())
    data["images"][1]["file_name"] = 17
    info.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=rf"image_info_unlabeled2017.json.*file_name.*{data['images'][1]['id']}"):
        read_benchmark("circo", root, "val")


def test_exports_are_copies_and_never_mix_two_splits(tiny_world, tmp_path):
    """Findings 3 and 8: exported images were hard links (editing the export edited the world), and a second split
    exported into the same folder kept the first split's images under colliding names."""
    import os
    from foco.benchmarks.export import export_world
    from foco.utils.io import ManifestError
    out = _export(tiny_world, "circo", tmp_path / "circo")
    img = next(p for p in out.rglob("*.png"))
    assert os.stat(img).st_nlink == 1  # a copy
    export_world(tiny_world, "circo", "val", out)  # the same export again: the same bytes, kept
    with pytest.raises(ManifestError, match="another split.*own --out"):
        export_world(tiny_world, "circo", "test", out)
    other = next(p for p in out.rglob("*.png") if p != img)
    img.write_bytes(other.read_bytes())  # a file of the same name but another image
    with pytest.raises(ManifestError, match="another image.*--out"):
        export_world(tiny_world, "circo", "val", out)


def test_a_duplicate_fashioniq_image_is_named(tiny_world, tmp_path):
    """Finding 8: a duplicate name in a FashionIQ split file was reported without the name."""
    import json
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    root = _export(tiny_world, "fashioniq", tmp_path / "fiq")
    split = next((root / "image_splits").glob("split.*.val.json"))
    names = json.loads(split.read_text())
    split.write_text(json.dumps(names + [names[0]]))
    with pytest.raises(ManifestError, match=rf"{split.name}: 1 duplicate image names, e.g. {names[0]}"):
        read_benchmark("fashioniq", root, "val")
