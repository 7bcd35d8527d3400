"""Retrieval metrics against naive twins."""
import random

import torch

from foco.metrics import diagonal_recalls, rank_by_score, recall_at_k


def naive_recall(scores, targets, k):
    hits = 0
    for q, row in enumerate(scores.tolist()):
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        hits += any(j in targets[q] for j in order[:k])
    return 100.0 * hits / len(targets)


def test_recall_matches_naive_on_random_scores():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        Q, N = 13, 40
        scores = torch.randint(0, 6, (Q, N), generator=g).float()  # many ties
        targets = [random.Random(trial * 100 + q).sample(range(N), 1 + q % 3) for q in range(Q)]
        ranking = rank_by_score(scores)
        for k in (1, 2, 5, 10, 40):
            assert recall_at_k(ranking, targets, k) == naive_recall(scores, targets, k)


def test_diagonal_recalls_hand_computed():
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.7, 0.0], [0.3, 0.2, 0.1]])
    r = diagonal_recalls(scores, (1, 2, 3))
    assert r == {"R@1": 100 / 3, "R@2": 200 / 3, "R@3": 100.0}


def naive_ap(ranked, gt, k):
    """CIRCO's evaluator, written out: precision at every hit among the first k, over min(|gt|, k)."""
    labels = [1 if r in gt else 0 for r in ranked[:k]]
    precs = [sum(labels[: n + 1]) / (n + 1) * labels[n] for n in range(len(labels))]
    return sum(precs) / min(len(gt), k)


def test_map_matches_naive_on_random_rankings():
    from foco.metrics import map_at_k
    g = torch.Generator().manual_seed(1)
    for trial in range(10):
        Q, N = 9, 60
        ranking = torch.stack([torch.randperm(N, generator=g) for _ in range(Q)])
        targets = [random.Random(trial * 50 + q).sample(range(N), 1 + (q * 7) % 12) for q in range(Q)]
        for k in (5, 10, 25, 50):
            want = 100 * sum(naive_ap(ranking[q].tolist(), set(t), k) for q, t in enumerate(targets)) / Q
            assert abs(map_at_k(ranking, targets, k) - want) < 1e-9


def test_map_hand_computed_edge_cases():
    from foco.metrics import average_precision_at_k
    # fewer ground truths than K: normalised by |gt|
    assert average_precision_at_k([3, 1, 2, 0, 4], [1], 5) == 0.5
    # hits at ranks 1 and 3 with 2 ground truths: (1/1 + 2/3) / 2
    assert abs(average_precision_at_k([7, 8, 9], [7, 9], 3) - (1 + 2 / 3) / 2) < 1e-12
    # more ground truths than K: normalised by K
    assert average_precision_at_k([1, 2], [1, 2, 3, 4], 2) == 1.0
    assert average_precision_at_k([5, 6], [1], 2) == 0.0


def test_subset_recall_hand_computed():
    from foco.metrics import subset_recall_at_k
    rankings = [[4, 2, 9], [9, 4, 2]]
    assert subset_recall_at_k(rankings, [[2], [2]], 1) == 0.0
    assert subset_recall_at_k(rankings, [[2], [2]], 2) == 50.0
    assert subset_recall_at_k(rankings, [[2], [2]], 3) == 100.0


def test_exact_index_matches_brute_force_with_reference_removed():
    from foco.index import ExactIndex
    g = torch.Generator().manual_seed(3)
    gallery = torch.nn.functional.normalize(torch.randn(200, 16, generator=g), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(30, 16, generator=g), dim=-1)
    exclude = torch.randint(0, 200, (30,), generator=g)
    index = ExactIndex(16)
    index.add(gallery)
    scores, ids = index.search(queries, 10, exclude=exclude, chunk=7)
    for q in range(30):
        brute = sorted((j for j in range(200) if j != int(exclude[q])),
                       key=lambda j: -float(queries[q] @ gallery[j]))[:10]
        assert ids[q].tolist() == brute
        assert torch.allclose(scores[q], queries[q] @ gallery[brute].t())
    # the reference ranked first would otherwise be the top hit
    _, ids2 = index.search(gallery[:5], 1, exclude=torch.arange(5))
    assert all(int(ids2[i, 0]) != i for i in range(5))


def test_score_queries_removes_reference_only_for_single():
    """A query equal to its reference: reference removed in `single`, kept (and found) in `multi`."""
    from foco.benchmarks.base import CIRBenchmark, CIRQuery
    from foco.benchmarks.world import PROTOCOLS
    from foco.eval.rank import score_queries
    g = torch.nn.functional.normalize(torch.eye(8)[:6] + 0.01, dim=-1)
    ids = [f"g{i}" for i in range(6)]

    def bench(protocol, targets, subset):
        query = CIRQuery("q0", "g0", ("m",), targets, subset=subset, category="colour")
        return CIRBenchmark(f"world/{protocol}", "val", {}, ids, [query], PROTOCOLS[protocol])
    single = score_queries(g[:1], bench("single", ["g1"], ids), ids, g)
    assert single["R@50"] == 100.0 and single["Rs@3"] in (0.0, 100.0)
    multi = score_queries(g[:1], bench("multi", ["g0"], []), ids, g)
    assert multi["mAP@5"] == 100.0  # the reference is not removed in the multi protocol


def test_the_results_table_is_markdown_with_a_separator_cell_per_column():
    from foco.eval.report import results_table
    res = {"benchmark": "world", "split": "val", "backbone": "b", "parts": {
        "world/single": {"queries": 2, "gallery": 3, "discarded": 0,
                         "methods": {"foco": {"R@1": 50.0, "R@5": 100.0}, "sum": {"R@1": 0.0, "R@5": 50.0}}},
        "world/multi": {"queries": 2, "gallery": 3, "discarded": 0, "methods": {"foco": {"mAP@5": 12.5}}}}}
    table = [line for line in results_table(res).splitlines() if line.startswith("|")]
    cells = [len(line.strip("|").split("|")) for line in table]
    assert table[0] == "| part | method | R@1 | R@5 | mAP@5 |" and set(cells) == {5}, table
    assert table[1] == "|---|---|---|---|---|"
    assert "| world/multi | foco | - | - | 12.50 |" in table


def naive_instance_recall(scores, query_instances, gallery_instances, k, exclude=None):
    """R_ID@K written out: sort each row (ties by gallery order), drop the reference, look at the first k images."""
    hits = 0
    for q, row in enumerate(scores.tolist()):
        order = [j for j in sorted(range(len(row)), key=lambda j: (-row[j], j)) if exclude is None or j != exclude[q]]
        hits += any(query_instances[q] in gallery_instances[j] for j in order[:k])
    return 100.0 * hits / len(query_instances)


def test_instance_recall_matches_naive_and_is_not_recall():
    from foco.index import ExactIndex
    from foco.metrics import instance_recall_at_k
    g = torch.Generator().manual_seed(1)
    names = ["a", "b", "c", "d", "e"]
    for trial in range(20):
        Q, N, D = 11, 30, 6
        rnd = random.Random(trial)
        gallery_instances = [rnd.sample(names, rnd.randint(0, 2)) for _ in range(N)]  # 0-2 instances an image
        query_instances = [rnd.choice(names + ["unseen"]) for _ in range(Q)]
        scores = torch.randint(0, 5, (Q, N), generator=g).float()  # ties
        for k in (1, 2, 5, 30):
            assert instance_recall_at_k(rank_by_score(scores), query_instances, gallery_instances, k) == \
                naive_instance_recall(scores, query_instances, gallery_instances, k)
        # the reference removed, as the benchmark's ranking does
        gal, qs = torch.nn.functional.normalize(torch.randn(N, D, generator=g), dim=-1), torch.randn(Q, D, generator=g)
        exclude = torch.randint(0, N, (Q,), generator=g)
        index = ExactIndex(D)
        index.add(gal)
        _, ranking = index.search(qs, 5, exclude=exclude)
        assert instance_recall_at_k(ranking, query_instances, gallery_instances, 5) == \
            naive_instance_recall(qs @ gal.T, query_instances, gallery_instances, 5, exclude.tolist())
    # the top image shows the instance without being the target: R_ID@1 counts it, R@1 does not
    ranking = torch.tensor([[2, 0, 1]])
    assert instance_recall_at_k(ranking, ["x"], [["x"], [], ["y", "x"]], 1) == 100.0
    assert recall_at_k(ranking, [[0]], 1) == 0.0
    assert instance_recall_at_k(ranking, ["z"], [["x"], [], ["y", "x"]], 3) == 0.0
