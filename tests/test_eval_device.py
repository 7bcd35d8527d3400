"""Issue 41: evaluation runs on the run's device. Composing and exact ranking take `--device`, not just the backbone.

Checked on the CPU with the `meta` device, as tests/test_devices.py checks training. Each method is put on `meta`
(`QueryMethod.to`, what `build_method` does with `MethodOptions.device`). The benchmark's features are read from the
CPU cache as usual. `DeviceMix` then records every aten op that takes a CPU tensor (other than a 0-dim scalar) next
to a meta one: a batch that compose did not move, or a gallery that rank did not move. The meta device has shapes
but no values, so ranking runs until its first data-dependent step (the tie check of the top-k). Every op before
that step is checked, the gallery scoring included.
"""
from __future__ import annotations

import pytest
import torch

from test_devices import DeviceMix


@pytest.fixture
def part(tiny_world, eval_features):
    from foco.benchmarks import read_benchmark
    from foco.benchmarks.world import world_cache_features
    bench = read_benchmark("world", tiny_world, "test", protocols=("single",))[0]
    return bench, world_cache_features(eval_features)(bench)


def _methods(dim: int):
    from foco.methods import build_method
    from foco.methods.foco import FoCoMethod
    from foco.model import ComposedQueryEncoder, FoCoConfig
    torch.manual_seed(0)
    yield "foco", FoCoMethod(ComposedQueryEncoder(FoCoConfig(dim=dim)))
    for name, opts in (("slerp", {"slerp_alpha": 0.5}), ("sum", {}), ("image", {}), ("text", {})):
        yield name, build_method(name, **opts)


def test_compose_runs_every_batch_on_the_methods_device(part):
    from foco.eval.compose import compose
    bench, feats = part
    for name, method in _methods(feats.gallery.shape[1]):
        method.to("meta")
        assert method.device.type == "meta"
        mix = DeviceMix()
        with mix:
            cq = compose(method, bench, feats, batch_size=16)
        assert mix.found == [], f"{name}: " + "\n".join(mix.found)
        assert cq.query.device.type == "meta" and cq.query.shape == (len(bench.queries), feats.gallery.shape[1])
        if name == "foco":
            assert cq.attention is not None and cq.attention.device.type == "meta"


class _OpsOn(DeviceMix):
    """DeviceMix that also counts the matrix products it saw and their devices."""

    def __init__(self):
        super().__init__()
        self.products: list[set[str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith(("mm", "bmm", "addmm", "matmul")):
            self.products.append({a.device.type for a in args if isinstance(a, torch.Tensor)})
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("lam", [None, 0.5])
def test_rank_scores_the_gallery_where_the_queries_are(part, lam):
    """Cosine ranking (ExactIndex) and Chord (its exact search) both move the gallery and the references to the
    queries' device before scoring."""
    from foco.eval.compose import reference_rows
    from foco.eval.rank import Chord, rank
    bench, feats = part
    queries = torch.empty(len(bench.queries), feats.gallery.shape[1], device="meta")
    chord = None if lam is None else Chord(lam, feats.references.global_[reference_rows(bench, feats)].float())
    mix = _OpsOn()
    with pytest.raises((RuntimeError, NotImplementedError)), mix:  # meta has no values: the tie check stops it
        rank(bench, feats.gallery_ids, feats.gallery, queries, chord)
    assert mix.found == [], "\n".join(mix.found)
    assert mix.products and all(devices == {"meta"} for devices in mix.products), mix.products


def test_build_method_puts_the_trained_modules_on_the_options_device(tmp_path):
    """`MethodOptions.device` reaches the modules: a FoCo checkpoint built for `meta` has every weight there."""
    from foco.methods import MethodOptions, build_method
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=16)).save(tmp_path)
    method = build_method("foco", checkpoint=tmp_path, opts=MethodOptions(device="meta"))
    assert method.device.type == "meta"
    assert {p.device.type for p in method.modules()[0].parameters()} == {"meta"}
    assert build_method("foco", checkpoint=tmp_path).device.type == "cpu"  # the default


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_evaluation_gives_the_cpu_metrics(part, tmp_path):
    from foco.eval.evaluate import EvalConfig, evaluate
    from foco.methods import MethodOptions
    from foco.model import ComposedQueryEncoder, FoCoConfig
    bench, feats = part
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=feats.gallery.shape[1])).save(tmp_path)
    results = {}
    for device in ("cpu", "cuda"):
        cfg = EvalConfig(methods=("foco", "sum", "image", "text"), chord=0.5,
                         options=MethodOptions(checkpoint=tmp_path, device=device))
        results[device] = evaluate([bench], lambda b: feats, cfg)["parts"][bench.name]["methods"]
    flips = 2 * 100.0 / len(bench.queries)  # at most two queries may move across a near tie (TF32, reductions)
    for name, metrics in results["cpu"].items():
        for key, value in metrics.items():
            assert results["cuda"][name][key] == pytest.approx(value, abs=flips), (name, key)


def test_the_search_engine_composes_on_the_methods_device(four_image_index, tmp_path):
    """`foco search` and `foco serve` compose through the engine: with FoCo's encoder on `meta`, the query batch goes
    there (no op mixes it with the CPU), and only the meta query's copy back for FAISS fails (it has no values)."""
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.search.engine import Query, SearchEngine
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256)).save(tmp_path / "foco", {"backbone": "world:pretrained"})
    engine = SearchEngine.open(four_image_index, checkpoint=tmp_path / "foco", device="cpu")
    assert engine.search(Query("make it red", reference=1, k=2)).hits  # on the CPU it answers
    method = engine._method("foco").to("meta")
    assert {p.device.type for p in method.model.parameters()} == {"meta"}
    mix = DeviceMix()
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"), mix:
        engine.search(Query("make it red", reference=1, k=2))
    assert mix.found == [], "\n".join(mix.found)
