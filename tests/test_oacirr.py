"""OACIRR's official layout (`foco.benchmarks.oacirr`) read back from the world's OACIR protocol exported to it
(`foco.benchmarks.export_oacirr`), scored against a twin of the official evaluate.py formulas."""
import json
import shutil

import numpy as np
import pytest
import torch

from foco.benchmarks import read_benchmark
from foco.benchmarks.oacirr import read_oacirr
from foco.benchmarks.world import read_world
from foco.cli import main
from foco.eval.rank import rank, score
from foco.utils.io import ManifestError
from foco.world import load_benchmark
from foco.benchmarks.export_oacirr import SUMMARY, instance_folder
from foco.world.oacir import load_oacir

ANN = "OACIRR-Subset/OACIRR-Shapes/oacirr-shapes"
# world split -> (OACIRR domain, file split)
WHERE = {"test": ("shapes", "val"), "val": ("shapes-val", "val"), "train": ("shapes", "train")}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    base = tmp_path_factory.mktemp("oacirr")
    world, out = base / "w", base / "OACIRR"
    assert main(["world", "generate", "--size", "tiny", "--out", str(world)]) == 0
    assert main(["world", "oacir", "--world", str(world), "--queries", "20"]) == 0
    assert main(["world", "export", "--world", str(world), "--format", "oacirr", "--out", str(out)]) == 0
    return world, out


@pytest.mark.parametrize("split", ["test", "val", "train"])
def test_export_reads_back_as_the_world(export, split):
    world, out = export
    domain, file_split = WHERE[split]
    (part,) = read_oacirr(out, file_split, (domain,))
    b, ann = load_benchmark(world, split, "oacir"), load_oacir(world, split)
    folders = json.loads((out / SUMMARY).read_text())["instance_folders"]
    assert part.name == f"oacirr/{domain}" and part.split == file_split
    assert len(part.queries) == len(b.query_ids) > 0
    assert part.gallery == b.gallery_ids
    for q, ref, mod, targets, box, inst in zip(part.queries, b.references, b.modifications, b.targets,
                                               ann.boxes.tolist(), ann.instances):
        assert (q.reference, q.texts, q.targets) == (ref, (mod,), targets)
        assert q.box == pytest.approx(tuple(box)) and q.box_size == (ann.image_size, ann.image_size)
        assert q.instance == instance_folder(inst) and folders[q.instance] == inst
        assert part.instances[q.reference] == (q.instance,)  # the reference is filed under its anchored instance
    for g in part.gallery:  # each image's folder is an instance it shows in the world
        (folder,) = part.instances[g]
        assert folders[folder] in ann.gallery_instances[g]
        assert part.images[g].path.parent.name == folder and part.images[g].path.is_file()


def official_metrics(sim, index_names, reference_names, target_names, name_to_relpath):
    """evaluate.py's compute_oacirr_val_metrics + compute_class_recall (HaHaJun1101/OACIR), in numpy."""
    distances = 1 - sim
    sorted_index_names = np.array(index_names)[np.argsort(distances, axis=-1, kind="stable")]
    n = len(index_names)
    reference_mask = sorted_index_names != np.repeat(np.array(reference_names), n).reshape(len(target_names), -1)
    sorted_index_names = sorted_index_names[reference_mask].reshape(sorted_index_names.shape[0], n - 1)
    labels = sorted_index_names == np.repeat(np.array(target_names), n - 1).reshape(len(target_names), -1)
    assert (labels.sum(-1) == 1).all()
    out = {f"R@{k}": labels[:, :k].sum() / len(labels) * 100 for k in (1, 5, 10, 50)}
    name_to_folder = {name: path.split("/")[-2] for name, path in name_to_relpath.items()}
    target_folders = np.array([name_to_folder.get(name) for name in target_names])
    sorted_index_folders = np.vectorize(name_to_folder.get)(sorted_index_names)
    class_labels = (sorted_index_folders == target_folders[:, np.newaxis]).astype(int)
    modified = ((class_labels == 1) & (np.cumsum(class_labels, axis=1) == 1)).astype(int)
    out.update({f"R_ID@{k}": np.sum(modified[:, :k]) / len(target_names) * 100 for k in (1, 3, 5)})
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_and_score_match_the_official_formulas(export, seed):
    world, out = export
    (part,) = read_benchmark("oacirr", out, "val", domains=("shapes",))
    rng = torch.Generator().manual_seed(seed)
    gallery = torch.nn.functional.normalize(torch.randn(len(part.gallery), 8, generator=rng), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(len(part.queries), 8, generator=rng), dim=-1)
    got = score(part, rank(part, part.gallery, gallery, queries))
    rel = json.loads((out / ANN / "image_splits" / "split.val.json").read_text())
    caps = json.loads((out / ANN / "quadruple_captions" / "caption_full.val.json").read_text())
    want = official_metrics((queries @ gallery.T).double().numpy(), list(rel), [c["reference"] for c in caps],
                            [c["target"] for c in caps], rel)
    assert set(got) == set(want) | {"Avg"}
    for k, v in want.items():
        assert got[k] == pytest.approx(v), k
    assert got["Avg"] == pytest.approx((want["R_ID@1"] + want["R@1"] + want["R@5"]) / 3)
    (own,) = read_world(world, "test", ("oacir",))  # the same queries and gallery: the same R@K as the world's
    mine = score(own, rank(own, own.gallery, gallery, queries))
    assert (mine["R@1"], mine["R@5"]) == (got["R@1"], got["R@5"])


def _copy(export, tmp_path):
    dst = tmp_path / "OACIRR"
    shutil.copytree(export[1], dst)
    return dst


def test_damaged_files_are_named(export, tmp_path):
    root = _copy(export, tmp_path)
    cap = root / ANN / "quadruple_captions" / "caption_full.val.json"
    entries = json.loads(cap.read_text())
    cap.write_text(cap.read_text()[:-20])  # truncated json
    with pytest.raises(ManifestError, match="caption_full.val.json"):
        read_oacirr(root, "val", ("shapes",))
    del entries[3]["target"]
    cap.write_text(json.dumps(entries))
    with pytest.raises(ManifestError, match=r"caption_full\.val\.json.*lack 'target', e\.g\. #3"):
        read_oacirr(root, "val", ("shapes",))
    entries[3]["target"] = "nope"
    entries[5]["reference_bounding_box"] = [10, 10, 5, 20]
    cap.write_text(json.dumps(entries))
    with pytest.raises(ManifestError, match=r"reference_bounding_box.*#5"):
        read_oacirr(root, "val", ("shapes",))
    entries[5]["reference_bounding_box"] = [1, 1, 5, 5]
    cap.write_text(json.dumps(entries))
    with pytest.raises(ManifestError, match="1 targets not in split.val.json.*nope"):
        read_oacirr(root, "val", ("shapes",))
    split = root / ANN / "image_splits" / "split.val.json"
    split.write_text(json.dumps({"a": "flat.png"}))
    with pytest.raises(ManifestError, match="split.val.json.*INSTANCE_FOLDER/FILE"):
        read_oacirr(root, "val", ("shapes",))
    with pytest.raises(ManifestError, match="annotation file not found.*oacirr-fashion"):
        read_oacirr(root, "val", ("fashion",))
    with pytest.raises(ValueError, match="train or val"):
        read_oacirr(root, "test", ("shapes",))
