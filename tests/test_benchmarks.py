"""Official-format benchmarks: readers on world exports agree with the world's own evaluation, metric twins and
edge cases, submission files, and errors that say what is missing and how often."""
import json
import random
import shutil

import pytest
import torch
from PIL import Image

from foco.benchmarks import CIRBenchmark, CIRQuery, read_benchmark
from foco.benchmarks.base import ImageRef, dilated_square_crop
from foco.benchmarks.cirr import PROTOCOL as CIRR
from foco.benchmarks.circo import PROTOCOL as CIRCO
from foco.benchmarks.genecis import PROTOCOL as GENECIS
from foco.benchmarks.genecis import modal_gallery_length
from foco.eval.rank import rank, score
from foco.eval.submission import SubmissionError, write_circo, write_cirr
from foco.cli import main
from foco.utils.io import ImageLoadError, ManifestError

METHODS = "foco,image,text,sum"


# ---------------------------------------------------------------- fixtures: a small untrained backbone and FoCo

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An untrained small world backbone and an untrained FoCo on it: the equivalence tests need only
    determinism, not accuracy."""
    from foco.backbones.world import WorldBackboneConfig, WorldCLIP, save_world_checkpoint
    from foco.model import FoCoConfig
    from foco.model.encoder import ComposedQueryEncoder
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32, text_width=32,
                                                        text_layers=1, text_heads=2)), root / "bb")
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(root / "foco")
    meta = json.loads((root / "foco" / "foco.json").read_text())
    meta["backbone"] = f"world:{root / 'bb'}"  # as `foco train` records it
    (root / "foco" / "foco.json").write_text(json.dumps(meta))
    return {"backbone": f"world:{root / 'bb'}", "checkpoint": root / "foco"}


@pytest.fixture(scope="module")
def direct(tiny_world, models, tmp_path_factory):
    """The world's own evaluation of val (both protocols) through `foco features extract` + `foco eval --world`."""
    root = tmp_path_factory.mktemp("direct")
    for protocol in ("single", "multi"):
        assert main(["features", "extract", "--backbone", models["backbone"], "--world", str(tiny_world),
                     "--split", f"val/{protocol}", "--out", str(root / f"val-{protocol}")]) == 0
    assert main(["eval", "--world", str(tiny_world), "--split", "val", "--features", str(root), "--methods", METHODS,
                 "--checkpoint", str(models["checkpoint"]), "--out", str(root / "direct.json")]) == 0
    return {"features": root, "results": json.loads((root / "direct.json").read_text())["methods"]}


def _export(world, fmt, split, out):
    assert main(["world", "export", "--world", str(world), "--format", fmt, "--split", split, "--out", str(out)]) == 0
    return json.loads((out / f"world_export.{fmt}.{split}.json").read_text())


def _eval(models, bench, root, out, *extra):
    args = ["eval", "--benchmark", bench, "--root", str(root), "--methods", METHODS,
            "--checkpoint", str(models["checkpoint"]), "--cache", str(out / "cache"), "--out", str(out / "res.json"),
            *extra]
    assert main(args) == 0
    return json.loads((out / "res.json").read_text())


def _world_rows(tiny_world, models, direct):
    """World val/single from the `foco features extract` caches, and each method's composed queries."""
    from foco.benchmarks.world import load_world_part
    from foco.eval.compose import compose
    from foco.methods import build_method
    bench, feats = load_world_part(tiny_world, "val", "single", direct["features"] / "val-single")
    queries = {m: compose(build_method(m, models["checkpoint"]), bench, feats).query for m in METHODS.split(",")}
    return bench, feats, queries


def _restrict(bench, rows):
    from dataclasses import replace
    return replace(bench, queries=[bench.queries[i] for i in rows])


# ---------------------------------------------------------------- readers on world exports == the world itself

def test_cirr_export_equals_world_single(tiny_world, models, direct, tmp_path, capsys):
    _export(tiny_world, "cirr", "val", tmp_path / "cirr")
    split = json.loads((tmp_path / "cirr" / "image_splits" / "split.rc2.val.json").read_text())
    assert all(p.startswith("./dev/") for p in split.values())
    res = _eval(models, "cirr", tmp_path / "cirr", tmp_path)
    assert "| cirr | foco |" in capsys.readouterr().out
    for m, got in res["parts"]["cirr"]["methods"].items():
        want = {k: v for k, v in direct["results"][m].items() if k.startswith("R")}
        assert got == want, m


def test_circo_export_equals_world_multi(tiny_world, models, direct, tmp_path):
    _export(tiny_world, "circo", "val", tmp_path / "circo")
    ann = json.loads((tmp_path / "circo" / "annotations" / "val.json").read_text())
    assert all(isinstance(e["reference_img_id"], int) and e["target_img_id"] == e["gt_img_ids"][0] for e in ann)
    # --backbone omitted: taken from the checkpoint's foco.json
    res = _eval(models, "circo", tmp_path / "circo", tmp_path)
    for m, got in res["parts"]["circo"]["methods"].items():
        assert got == {k: v for k, v in direct["results"][m].items() if k.startswith("mAP")}, m


def test_world_through_benchmark_path_equals_legacy_eval(tiny_world, models, direct, tmp_path):
    res = _eval(models, "world", tiny_world, tmp_path)
    for m in METHODS.split(","):
        merged = {**res["parts"]["world/single"]["methods"][m], **res["parts"]["world/multi"]["methods"][m]}
        assert merged == direct["results"][m]


def test_genecis_export_equals_world_subset_recall(tiny_world, models, direct, tmp_path):
    """GeneCIS R@K of a task == the world's Rs@K (CIRR subset recall: subset minus reference = [target] + the 4
    hard negatives) over the world queries exported into that task."""
    from foco.eval.rank import score_queries
    summary = _export(tiny_world, "genecis", "val", tmp_path / "g")
    item = json.loads((tmp_path / "g" / "genecis" / "change_attribute.json").read_text())[0]["reference"]
    assert item["instance_bbox"][:2] == [0, 0]
    assert (tmp_path / "g" / "VG_100K_all" / f"{item['image_id']}.png").is_file()
    res = _eval(models, "genecis", tmp_path / "g", tmp_path)
    bench, feats, queries = _world_rows(tiny_world, models, direct)
    row_of = {q.id: i for i, q in enumerate(bench.queries)}
    for part, entry in res["parts"].items():
        task = part.split("/")[1]
        rows = [row_of[w] for k, w in summary["query_ids"].items() if k.rsplit("-", 1)[0] == task]
        assert entry["queries"] == len(rows) > 0 and entry["discarded"] == 0
        for m, got in entry["methods"].items():
            want = score_queries(queries[m][torch.tensor(rows)], _restrict(bench, rows), feats.gallery_ids,
                                 feats.gallery)
            assert got == {f"R@{k}": want[f"Rs@{k}"] for k in (1, 2, 3)}, (part, m)
    n = {p: e["queries"] for p, e in res["parts"].items()}
    for m in METHODS.split(","):  # query-weighted mean over tasks == the world's Rs@1 over all queries
        pooled = sum(e["methods"][m]["R@1"] * n[p] for p, e in res["parts"].items()) / sum(n.values())
        assert pooled == pytest.approx(direct["results"][m]["Rs@1"])


def test_fashioniq_single_join_equals_direct_evaluation(tiny_world, models, direct, tmp_path):
    """Join "single": per category R@10/R@50 == the world's single gallery, reference kept, texts "{c1} and {c2}"."""
    from foco.backbones import create_backbone
    from dataclasses import replace
    from foco.eval.compose import compose
    from foco.features import FeatureCache, extract_texts
    from foco.index import ExactIndex
    from foco.metrics import recall_at_k
    summary = _export(tiny_world, "fashioniq", "val", tmp_path / "f")
    res = _eval(models, "fashioniq", tmp_path / "f", tmp_path, "--fashioniq-join", "single")
    assert set(res["parts"]) == {"fashioniq/dress", "fashioniq/shirt", "fashioniq/toptee"}

    bench, feats, _ = _world_rows(tiny_world, models, direct)
    row_of = {q.id: i for i, q in enumerate(bench.queries)}
    joined = {}
    for cat in ("dress", "shirt", "toptee"):
        entries = json.loads((tmp_path / "f" / "captions" / f"cap.{cat}.val.json").read_text())
        for i, e in enumerate(entries):
            joined[summary["query_ids"][f"{cat}-{i}"]] = (cat, f"{e['captions'][0]} and {e['captions'][1]}")
    texts = [joined[q.id][1] for q in bench.queries]
    extract_texts(create_backbone(models["backbone"]), [(t, t) for t in dict.fromkeys(texts)], tmp_path / "t")
    tids, tf = FeatureCache(tmp_path / "t").stored_texts()
    bench = replace(bench, queries=[replace(q, texts=(t,)) for q, t in zip(bench.queries, texts)])
    feats = replace(feats, text_ids=tids, texts=tf)
    pos = {g: i for i, g in enumerate(feats.gallery_ids)}
    target_index = [[pos[t] for t in q.targets] for q in bench.queries]
    index = ExactIndex(feats.gallery.shape[1])
    index.add(feats.gallery)
    from foco.methods import build_method
    for m in METHODS.split(","):
        queries = compose(build_method(m, models["checkpoint"]), bench, feats).query
        _, ranking = index.search(queries, 50)  # reference kept
        for cat in ("dress", "shirt", "toptee"):
            rows = [row_of[q] for q, (c, _) in joined.items() if c == cat]
            want = {f"R@{k}": recall_at_k(ranking[rows], [target_index[i] for i in rows], k) for k in (10, 50)}
            assert res["parts"][f"fashioniq/{cat}"]["methods"][m] == want, (cat, m)
    means = res["mean"]["sum"]
    assert means["R@10"] == pytest.approx(sum(res["parts"][p]["methods"]["sum"]["R@10"] for p in res["parts"]) / 3)
    # the other joins run, and cache their texts beside (not over) the "single" texts
    both = _eval(models, "fashioniq", tmp_path / "f", tmp_path, "--fashioniq-join", "both", "--methods", "sum")
    assert both["options"] == {"join": "both"} and all(0 <= v <= 100 for v in both["mean"]["sum"].values())
    assert len(list((tmp_path / "cache" / "fashioniq-dress").glob("texts-*"))) == 2


def test_test_split_exports_write_valid_submissions(tiny_world, models, tmp_path):
    _export(tiny_world, "cirr", "test", tmp_path / "cirr")
    caps = json.loads((tmp_path / "cirr" / "captions" / "cap.rc2.test1.json").read_text())
    assert "target_hard" not in caps[0] and "target_rank" not in caps[0]["img_set"]
    res = _eval(models, "cirr", tmp_path / "cirr", tmp_path, "--split", "test", "--methods", "sum",
                "--submission-dir", str(tmp_path / "sub"))
    assert res["parts"]["cirr"]["methods"]["sum"] == {}
    recall = json.loads((tmp_path / "sub" / "cirr_test_sum_recall.json").read_text())
    subset = json.loads((tmp_path / "sub" / "cirr_test_sum_recall_subset.json").read_text())
    assert (recall.pop("version"), recall.pop("metric")) == ("rc2", "recall")
    assert (subset.pop("version"), subset.pop("metric")) == ("rc2", "recall_subset")
    assert set(recall) == set(subset) == {str(e["pairid"]) for e in caps}
    for e in caps:
        top, top3 = recall[str(e["pairid"])], subset[str(e["pairid"])]
        assert len(top) == len(set(top)) == 50 and e["reference"] not in top
        assert len(top3) == 3 and set(top3) <= set(e["img_set"]["members"]) - {e["reference"]}

    _export(tiny_world, "circo", "test", tmp_path / "circo")
    assert "gt_img_ids" not in json.loads((tmp_path / "circo" / "annotations" / "test.json").read_text())[0]
    _eval(models, "circo", tmp_path / "circo", tmp_path, "--split", "test", "--methods", "sum")
    sub = json.loads((tmp_path / "circo_test_sum.json").read_text())  # default: beside --out
    assert all(len(v) == len(set(v)) == 50 and all(isinstance(i, int) for i in v) for v in sub.values())


# ---------------------------------------------------------------- errors: what is missing, and how many

@pytest.fixture(scope="module")
def exports(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    for fmt in ("cirr", "circo", "fashioniq", "genecis"):
        _export(tiny_world, fmt, "val", root / fmt)
    return root


def _copy(exports, fmt, tmp_path):
    shutil.copytree(exports / fmt, tmp_path / fmt)
    return tmp_path / fmt


def test_missing_images_are_counted_up_front(exports, models, tmp_path):
    root = _copy(exports, "cirr", tmp_path)
    split = json.loads((root / "image_splits" / "split.rc2.val.json").read_text())
    refs = {e["reference"] for e in json.loads((root / "captions" / "cap.rc2.val.json").read_text())}
    gone = [n for n in split if n not in refs][:3]
    for n in gone:
        (root / "dev" / f"{n}.png").unlink()
    with pytest.raises(ImageLoadError, match=r"3 gallery image\(s\) missing under .*dev, e\.g\. "):
        read_benchmark("cirr", root, "val")
    # through the CLI: refused before anything is encoded
    assert main(["eval", "--benchmark", "cirr", "--root", str(root), "--methods", "sum", "--backbone",
                 models["backbone"], "--cache", str(tmp_path / "cache")]) == 2
    assert not (tmp_path / "cache").exists()
    assert main(["eval", "--root", str(root)]) == 2  # neither --benchmark nor --world

    g = _copy(exports, "genecis", tmp_path)
    for p in sorted((g / "val2017").glob("*.png"))[:2]:
        p.unlink()
    with pytest.raises(ImageLoadError, match=r"image\(s\) missing under .*val2017"):
        read_benchmark("genecis", g, "val")


def test_missing_annotation_files_are_named(exports, tmp_path):
    cases = {"cirr": "captions/cap.rc2.val.json",
             "circo": "COCO2017_unlabeled/annotations/image_info_unlabeled2017.json",
             "fashioniq": "image_splits/split.shirt.val.json", "genecis": "genecis/focus_object.json"}
    for fmt, rel in cases.items():
        root = _copy(exports, fmt, tmp_path)
        (root / rel).unlink()
        with pytest.raises(ManifestError, match=f"annotation file not found: .*{rel.split('/')[-1]}"):
            read_benchmark(fmt, root, "val")
    with pytest.raises(ManifestError, match="cap.rc2.test1.json"):
        read_benchmark("cirr", exports / "cirr", "test")  # only val was exported


def test_malformed_entries_are_counted(exports, tmp_path):
    def edit(root, rel, change):
        path = root / rel
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    root = _copy(exports, "cirr", tmp_path)
    edit(root, "captions/cap.rc2.val.json", lambda d: [d[i].pop("caption") for i in (1, 4)])
    with pytest.raises(ManifestError, match=r"2 entr\(ies\) lack 'caption', e\.g\. #1 \(pairid 1\), #4"):
        read_benchmark("cirr", root, "val")
    root = _copy(exports, "circo", tmp_path)
    edit(root, "annotations/val.json", lambda d: d[0].update(gt_img_ids=[10 ** 9]))
    with pytest.raises(ManifestError, match="1 ground-truth images not in image_info_unlabeled2017.json"):
        read_benchmark("circo", root, "val")
    root = _copy(exports, "fashioniq", tmp_path)
    edit(root, "captions/cap.dress.val.json", lambda d: d[0].update(captions=["only one"]))
    with pytest.raises(ManifestError, match="1 entr.ies. with captions that are not a list of two strings"):
        read_benchmark("fashioniq", root, "val")
    root = _copy(exports, "genecis", tmp_path)
    edit(root, "genecis/change_attribute.json", lambda d: d[0]["target"].update(instance_bbox=[0, 0, 0, 5]))
    with pytest.raises(ManifestError, match="1 entr.ies. with an item without .*instance_bbox"):
        read_benchmark("genecis", root, "val")


def test_genecis_keeps_only_the_modal_gallery_length(exports, tmp_path):
    root = _copy(exports, "genecis", tmp_path)
    path = root / "genecis" / "focus_object.json"
    entries = json.loads(path.read_text())
    entries.append({**entries[0], "gallery": entries[0]["gallery"][:2]})
    path.write_text(json.dumps(entries))
    parts = {p.name: p for p in read_benchmark("genecis", root, "val")}
    assert parts["genecis/focus_object"].discarded == 1
    assert len(parts["genecis/focus_object"].queries) == len(entries) - 1
    assert all(len(q.gallery) == 5 for q in parts["genecis/focus_object"].queries)
    assert modal_gallery_length([3, 3, 5, 5, 7]) == 3 and modal_gallery_length([4, 9, 9]) == 9
    only = read_benchmark("genecis", root, "val", tasks=("change_object",))
    assert [p.name for p in only] == ["genecis/change_object"]
    with pytest.raises(ValueError, match="unknown GeneCIS task"):
        read_benchmark("genecis", root, "val", tasks=("change_colour",))


# ---------------------------------------------------------------- the GeneCIS crop

def test_dilated_square_crop_hand_computed():
    im = Image.new("RGB", (100, 50), (200, 10, 10))
    # box x=10, y=10, w=20, h=10: left=max(0,10-14)=0, top=max(0,10-7)=3, right=min(100,0+34)=34,
    # bottom=min(50,3+17)=20 -> a 34 x 17 crop, padded to 34 x 34 with black bands of 8 and 9 rows
    out = dilated_square_crop(im, (10, 10, 20, 10), 0.7)
    assert out.size == (34, 34)
    assert out.getpixel((5, 3)) == (0, 0, 0) and out.getpixel((5, 8)) == (200, 10, 10)
    assert out.getpixel((5, 24)) == (200, 10, 10) and out.getpixel((5, 25)) == (0, 0, 0)
    # a full-image box keeps a square image as it is (what world exports rely on)
    sq = Image.new("RGB", (64, 64), (1, 2, 3))
    sq.putpixel((5, 7), (9, 9, 9))
    assert dilated_square_crop(sq, (0, 0, 64, 64), 0.7).tobytes() == sq.tobytes()


def test_image_ref_key_includes_the_box(tmp_path):
    assert str(ImageRef(tmp_path / "a.jpg", (1, 2, 3.5, 4))).endswith("a.jpg#box=1,2,3.5,4")
    assert str(ImageRef(tmp_path / "a.jpg")) == str(tmp_path / "a.jpg")


# ---------------------------------------------------------------- ranking and metrics: naive twins, edge cases

def _bench(protocol, n_gallery, queries):
    ids = [f"g{i}" for i in range(n_gallery)]
    return CIRBenchmark("t", "val", {}, ids if protocol is not GENECIS else [], queries, protocol)


def _naive_order(scores, candidates):
    """Candidates sorted by score, best first, ties in the given order."""
    return sorted(candidates, key=lambda j: (-scores[j], candidates.index(j)))


def _naive_chord(q, c, r, lam):
    """cos(q, c) + lam * cos(c - r, q - r), one pair at a time, in plain Python."""
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    cr = [x - y for x, y in zip(c, r)]
    qr = [x - y for x, y in zip(q, r)]
    n = (dot(cr, cr) * dot(qr, qr)) ** 0.5
    return dot(q, c) + lam * (dot(cr, qr) / n if n > 1e-12 else 0.0)


@pytest.mark.parametrize("lam", [0.0, 0.4])
def test_scoring_matches_naive_on_random_vectors(lam):
    from foco.eval.rank import Chord
    g = torch.Generator().manual_seed(0)
    N, Q, D = 60, 25, 4
    gallery = torch.nn.functional.normalize(torch.randn(N, D, generator=g), dim=-1)  # ties: see the ties test
    qv = torch.nn.functional.normalize(torch.randn(Q, D, generator=g), dim=-1)
    rnd = random.Random(0)
    ids = [f"g{i}" for i in range(N)]
    qs = []
    for q in range(Q):
        members = rnd.sample(range(N), 6)
        qs.append(CIRQuery(f"q{q}", f"g{members[0]}", ("t",), [f"g{j}" for j in rnd.sample(members[1:], 1 + q % 3)],
                           subset=[f"g{m}" for m in members], gallery=[f"g{m}" for m in members[1:]]))
    refs = gallery[[int(q.reference[1:]) for q in qs]]  # (Q, D)
    if lam:
        sc = [[_naive_chord(qv[q].tolist(), gallery[j].tolist(), refs[q].tolist(), lam) for j in range(N)]
              for q in range(Q)]
    else:
        sc = (qv @ gallery.t()).tolist()
    for protocol in (CIRR, CIRCO, GENECIS):
        bench = _bench(protocol, N, qs)
        got = score(bench, rank(bench, ids, gallery, qv, Chord(lam, refs) if lam else None))
        want = {}
        for k in protocol.recall_ks:
            hits = 0
            for q, query in enumerate(qs):
                if protocol is GENECIS:
                    cand = [int(x[1:]) for x in query.gallery]
                else:
                    cand = [j for j in range(N) if not (protocol.remove_reference and f"g{j}" == query.reference)]
                top = _naive_order(sc[q], cand)[:k]
                hits += any(f"g{j}" in query.targets for j in top)
            want[f"R@{k}"] = 100 * hits / Q
        for k in protocol.subset_ks:
            hits = 0
            for q, query in enumerate(qs):
                cand = [int(m[1:]) for m in query.subset if m != query.reference]
                hits += any(f"g{j}" in query.targets for j in _naive_order(sc[q], cand)[:k])
            want[f"Rs@{k}"] = 100 * hits / Q
        for k in protocol.map_ks:
            total = 0.0
            for q, query in enumerate(qs):
                ranked = _naive_order(sc[q], list(range(N)))[:k]
                hits, ap = 0, 0.0
                for n, j in enumerate(ranked, 1):
                    if f"g{j}" in query.targets:
                        hits += 1
                        ap += hits / n
                total += ap / min(len(query.targets), k)
            want[f"mAP@{k}"] = 100 * total / Q
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-9), (protocol, key)


def test_subset_recall_matches_naive_on_random_per_query_galleries():
    from foco.metrics import subset_recall_at_k
    rnd = random.Random(1)
    for _ in range(20):
        rankings = [rnd.sample(range(100), rnd.randint(1, 15)) for _ in range(30)]
        targets = [rnd.sample(range(100), rnd.randint(1, 3)) for _ in range(30)]
        for k in (1, 2, 3, 10):
            naive = 100 * sum(any(t in r[:k] for t in ts) for r, ts in zip(rankings, targets)) / 30
            assert subset_recall_at_k(rankings, targets, k) == naive


def test_reference_ranked_first_cirr_removes_it_circo_does_not():
    # the query is the reference's vector: the reference scores 1.0; the target is second best
    gallery = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0, 1]]), dim=-1)
    q = gallery[:1].clone()
    ids = ["g0", "g1", "g2", "g3"]
    query = CIRQuery("q", "g0", ("t",), ["g1"], subset=ids)
    cirr = _bench(CIRR, 4, [query])
    assert score(cirr, rank(cirr, ids, gallery, q))["R@1"] == 100.0  # reference removed: the target is first
    circo = _bench(CIRCO, 4, [query])
    r = rank(circo, ids, gallery, q)
    assert r.full[0, :2].tolist() == [0, 1]
    assert score(circo, r)["mAP@5"] == 50.0  # reference kept at rank 1: AP@5 = (1/2) / min(1, 5)


def test_map_with_fewer_ground_truths_than_k_hand_computed():
    gallery = torch.eye(6)
    q = torch.nn.functional.normalize(torch.tensor([[6.0, 5, 4, 3, 2, 1]]), dim=-1)  # ranks g0, g1, ..., g5
    bench = _bench(CIRCO, 6, [CIRQuery("q", "g0", ("t",), ["g1", "g3"])])
    m = score(bench, rank(bench, [f"g{i}" for i in range(6)], gallery, q))
    assert m["mAP@5"] == pytest.approx(100 * (1 / 2 + 2 / 4) / 2)  # hits at 2 and 4; normaliser min(2, 5) = 2
    assert m["mAP@50"] == m["mAP@5"]  # gallery smaller than K: scored on what it has


def test_ties_rank_in_gallery_order_everywhere():
    from foco.index import ExactIndex
    from foco.metrics import rank_by_score
    g = torch.Generator().manual_seed(5)
    scores_basis = torch.randint(0, 4, (40, 200), generator=g).float()  # heavy ties, also at the top-k boundary
    gallery = torch.eye(200)
    index = ExactIndex(200)
    index.add(gallery)
    for k in (1, 7, 50):
        vals, ids = index.search(scores_basis, k, chunk=16)
        assert torch.equal(ids, rank_by_score(scores_basis, k))
        assert torch.equal(vals, scores_basis.gather(1, ids))
    # GeneCIS: a distractor tied with the target ranks after it (the target is index 0)
    gv = torch.tensor([[1.0, 0], [1.0, 0], [0, 1.0]])
    bench = _bench(GENECIS, 0, [CIRQuery("q", "r", ("t",), ["a"], gallery=["a", "b", "c"])])
    r = rank(bench, ["b", "a", "c"], gv, torch.tensor([[1.0, 0]]))
    assert r.own == [[0, 1, 2]] and score(bench, r)["R@1"] == 100.0


# ---------------------------------------------------------------- submission writers

def _cirr_bench(n_gallery=60):
    ids = [f"g{i}" for i in range(n_gallery)]
    qs = [CIRQuery(str(p), f"g{p}", ("t",), [], subset=[f"g{p}", *(f"g{(p + j) % n_gallery}" for j in range(7, 12))])
          for p in range(3)]
    return CIRBenchmark("cirr", "test", {}, ids, qs, CIRR)


def _good(bench):
    full = [(q.id, [g for g in bench.gallery if g != q.reference][:50]) for q in bench.queries]
    sub = [(q.id, [m for m in q.subset if m != q.reference][:3]) for q in bench.queries]
    return full, sub


def test_cirr_submission_written_when_valid(tmp_path):
    bench = _cirr_bench()
    full, sub = _good(bench)
    paths = write_cirr(tmp_path, bench, full, sub)
    data = json.loads(paths[0].read_text())
    assert data["version"] == "rc2" and data["metric"] == "recall" and len(data["0"]) == 50
    assert json.loads(paths[1].read_text())["metric"] == "recall_subset"
    assert not list(tmp_path.glob(".*tmp"))  # atomic: no temporary left behind


@pytest.mark.parametrize("breakage, message", [
    (lambda f, s: f.pop(), "1 queries without predictions"),
    (lambda f, s: f.append(f[0]), "1 query ids given more than once"),
    (lambda f, s: f.append(("99", f[0][1])), "1 unknown query ids"),
    (lambda f, s: f[0][1].__setitem__(1, f[0][1][0]), "1 queries with repeated predictions"),
    (lambda f, s: f[0][1].__setitem__(2, "nope"), "1 queries with ids not in the gallery"),
    (lambda f, s: f[1][1].pop(), r"1 queries with a wrong number of predictions, e.g. \['1 \(49, not 50\)'\]"),
    (lambda f, s: f[0][1].__setitem__(0, "g0"), "ranking the reference"),
    (lambda f, s: s[0][1].__setitem__(0, "g30"), "outside the query's subset"),
])
def test_cirr_submission_refused_when_invalid(tmp_path, breakage, message):
    bench = _cirr_bench()
    full, sub = _good(bench)
    full, sub = [(q, list(r)) for q, r in full], [(q, list(r)) for q, r in sub]
    breakage(full, sub)
    with pytest.raises(SubmissionError, match=message):
        write_cirr(tmp_path, bench, full, sub)
    assert not list(tmp_path.iterdir())  # nothing written


def test_circo_submission_ids_lengths_and_size(tmp_path):
    ids = [str(i) for i in range(1, 81)]
    bench = CIRBenchmark("circo", "test", {}, ids, [CIRQuery(str(q), "1", ("t",), []) for q in range(4)], CIRCO)
    preds = [(str(q), ids[q:q + 50]) for q in range(4)]
    path = write_circo(tmp_path, bench, preds)[0]
    assert json.loads(path.read_text())["0"][:3] == [1, 2, 3]  # integer image ids, as the server expects
    with pytest.raises(SubmissionError, match="wrong number of predictions"):
        write_circo(tmp_path, bench, [(q, r[:10]) for q, r in preds])
    with pytest.raises(SubmissionError, match="over the 0.0 MB limit"):
        write_circo(tmp_path / "big", bench, preds, max_bytes=100)
    assert not (tmp_path / "big").exists()


# ---------------------------------------------------------------- the speed script, at toy size

def test_speed_script_runs_small(tiny_world, models, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).parents[1] / "experiments" / "bench_benchmarks.py"
    spec = importlib.util.spec_from_file_location("bench_benchmarks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--backbone", models["backbone"], "--world", str(tiny_world), "--images", "32", "--gallery-size",
              "2000", "--queries", "16", "--dims", "32,64", "--repeats", "2"])
    out = json.loads(capsys.readouterr().out)
    assert out["extract_images_per_s"] > 0 and set(out["rank_s"]) == {"32", "64"}
