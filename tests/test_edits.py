"""Edit supervision written from captions (`foco edits generate`): derivation from decompositions, the rule
writer's templates, the exactly-once store, and the leakage rule (no world sampler, no val/test scene)."""
from __future__ import annotations

import ast
import json
import re
import sqlite3
from pathlib import Path

import pytest

from foco.cli import main
from foco.decompose.schema import Decomposition, LocalContextPair
from foco.edits.derive import PhrasePool, caption_rng, derive_edits, like_article, locate, swap_once
from foco.edits.rule import TEMPLATES, RuleWriter
from foco.edits.run import GenerateConfig, run_generate
from foco.edits.store import EditStore

EDITS = Path(__file__).resolve().parents[1] / "src" / "foco" / "edits"


def _dec(caption: str, locals_: list[str], contexts: list[str]) -> Decomposition:
    return Decomposition(caption, [LocalContextPair(loc, ctx) for loc, ctx in zip(locals_, contexts)])


CORPUS = [
    _dec("a red circle and a small blue star on grass", ["a red circle", "a small blue star", "grass"],
         ["a small blue star on grass", "a red circle on grass", "a red circle and a small blue star"]),
    _dec("a green star next to a small red circle in the desert",
         ["a green star", "a small red circle", "the desert"],
         ["a small red circle in the desert", "a green star in the desert", "a green star next to a small red circle"]),
    _dec("a large green circle under the sea", ["a large green circle", "the sea"],
         ["an empty scene under the sea", "a large green circle"]),
    _dec("a blue star on a beach", ["a blue star", "a beach"], ["an empty scene on a beach", "a blue star"]),
    _dec("a large red star and a blue circle in the snow", ["a large red star", "a blue circle", "the snow"],
         ["a blue circle in the snow", "a large red star in the snow", "a large red star and a blue circle"]),
]


@pytest.fixture(scope="module")
def pool():
    return PhrasePool.build(CORPUS)


def test_kinds_are_mined_from_the_corpus(pool):
    assert "blue" in pool.kind_mates["red"] and "green" in pool.kind_mates["red"]
    assert "small" not in pool.kind_mates["red"]  # they meet in "a small red circle": not of one kind
    assert "large" in pool.kind_mates.get("small", [])
    assert "star" in pool.head_mates["circle"] and "sea" not in pool.head_mates["circle"]


def test_every_kind_derives_a_consistent_edit(pool):
    seen = {}
    for seed in range(40):
        for i, dec in enumerate(CORPUS):
            for e in derive_edits(dec, pool, caption_rng(seed, str(i)), n=4):
                seen.setdefault(e.kind, e)
                assert e.target != dec.caption and e.target not in e.negatives and dec.caption in e.negatives
                if e.kind == "remove":
                    assert e.target == next(p.context for p in dec.pairs if p.local == e.phrase)
                elif e.kind == "replace":
                    assert e.new in e.target and swap_once(e.target, e.new, e.phrase) == dec.caption
                    donor, own = e.provenance["donor"], dec.pairs[e.provenance["pair"]].local
                    assert pool.parse[donor][0] in pool.head_mates[pool.parse[own][0]]  # object for object
                    settings = {pool.parse[donor][0] in pool.settings, pool.parse[own][0] in pool.settings}
                    assert len(settings) == 1  # ... and setting for setting
                elif e.kind == "attribute":
                    assert e.new in pool.kind_mates[e.old] and e.head in e.target
                    assert swap_once(e.target, swap_once(e.phrase, e.old, e.new), e.phrase) == dec.caption
                elif e.kind == "add":
                    assert e.target == f"{dec.caption} with {e.new}" and e.new not in dec.caption
    assert set(seen) == {"remove", "replace", "attribute", "add"}


def test_settings_are_one_kind_and_found_whatever_their_article(pool):
    assert {"sea", "beach", "desert", "snow", "grass"} <= pool.settings and "circle" not in pool.settings
    assert "beach" in pool.head_mates["sea"] and "circle" not in pool.head_mates["sea"]
    assert locate("a star under the night sky", "a night sky") == "the night sky"
    assert locate("a star on grass", "the grass") == "grass" and locate("a star", "a circle") is None
    assert like_article("a forest", "the beach") == "the forest" and like_article("the forest", "grass") == "forest"
    dec = _dec("a blue star against the sea", ["a blue star", "the sea"],
               ["an empty scene against the sea", "a blue star"])
    replaced = {e.target for s in range(60) for e in derive_edits(dec, pool, caption_rng(s, "bg"), n=4)
                if e.kind == "replace" and e.provenance["pair"] == 1}
    assert replaced and all(t.startswith("a blue star against the ") and "sea" not in t for t in replaced)
    added = [e for s in range(60) for e in derive_edits(dec, pool, caption_rng(s, "bg"), n=4) if e.kind == "add"]
    assert added and all(pool.parse[e.new][0] not in pool.settings for e in added)  # never a second setting


def test_derivation_is_deterministic_per_caption(pool):
    a = [derive_edits(CORPUS[0], pool, caption_rng(3, "x"), n=3) for _ in range(2)]
    assert a[0] == a[1] and len(a[0]) == 3 and len({e.target for e in a[0]}) == 3
    by_seed = {repr(derive_edits(CORPUS[0], pool, caption_rng(s, "x"), n=3)) for s in range(10)}
    assert len(by_seed) > 1  # the seed matters


def test_rule_templates_are_their_own():
    from foco.world.edits import PHRASINGS  # the benchmark's phrasings: the test may read them, the package may not

    def shape(t):
        return re.sub(r"\{[^}]*\}", "{}", t).strip().lower()
    world = {shape(t) for ts in PHRASINGS.values() for t in ts}
    train = {shape(t) for ts in TEMPLATES["train"].values() for t in ts}
    heldout = {shape(t) for ts in TEMPLATES["heldout"].values() for t in ts}
    assert not train & world and not heldout & world and not train & heldout
    assert set(TEMPLATES["train"]) == set(TEMPLATES["heldout"]) == {"remove", "replace", "attribute", "add"}
    with pytest.raises(ValueError, match="template set"):
        RuleWriter("nope")


def test_edits_package_imports_no_world_and_no_benchmark():
    for path in EDITS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = ("." * node.level) + (node.module or "")
                assert "world" not in name and "benchmarks" not in name and "eval" not in name, (path.name, name)
            elif isinstance(node, ast.Import):
                assert not any("foco.world" in a.name for a in node.names), path.name


def test_a_failed_batch_loses_and_repeats_nothing(pool, tmp_path):
    sources = [(f"img{i}", CORPUS[i % len(CORPUS)]) for i in range(40)]
    cfg = GenerateConfig(per_caption=2, batch_size=8)
    straight = run_generate(sources, RuleWriter(), tmp_path / "a.sqlite", cfg, pool)

    class Dies(RuleWriter):  # dies in the third batch, mid-way: that batch's transaction never happens
        calls = 0

        def instruction(self, edit, rng):
            Dies.calls += 1
            if Dies.calls == 2 * 8 * 2 + 3:
                raise KeyboardInterrupt
            return super().instruction(edit, rng)

    with pytest.raises(KeyboardInterrupt):
        run_generate(sources, Dies(), tmp_path / "b.sqlite", cfg, pool)
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 16
    again = run_generate(sources, RuleWriter(), tmp_path / "b.sqlite", cfg, pool)
    assert again.already_done == 16 and again.done_now == 24
    with EditStore(tmp_path / "a.sqlite") as a, EditStore(tmp_path / "b.sqlite") as b:
        ra, rb = a.records(straight.settings_id), b.records(again.settings_id)
    assert sorted(map(json.dumps, (r.to_dict() for r in ra))) == sorted(map(json.dumps, (r.to_dict() for r in rb)))
    assert straight.triplets_now == len(ra) == 2 * 40
    assert run_generate(sources, RuleWriter(), tmp_path / "b.sqlite", cfg, pool).done_now == 0


def test_cli_on_the_tiny_world_uses_train_scenes_only(tiny_world, tmp_path, capsys):
    from foco.utils.io import read_jsonl
    out = tmp_path / "edits.sqlite"
    assert main(["edits", "generate", "--in", str(tiny_world), "--out", str(out), "--per-caption", "2"]) == 0
    printed = capsys.readouterr().out
    assert "triplets by kind:" in printed and "attribute" in printed
    with EditStore(out) as store:
        (sid,) = store.settings()
        records = store.records(sid)
    train = {r["id"] for r in read_jsonl(tiny_world / "pairs" / "train.jsonl")}
    held = set()
    for split in ("val", "test"):
        for proto in ("single", "multi"):
            held |= {r["image"] for r in read_jsonl(tiny_world / "benchmarks" / split / proto / "gallery.jsonl")}
    images = {r["id"]: r["image"] for r in read_jsonl(tiny_world / "pairs" / "train.jsonl")}
    assert records and {r.source_id for r in records} <= train
    assert not {images[r.source_id] for r in records} & held
    assert {r.kind for r in records} == {"remove", "replace", "attribute", "add"}
    plain = tmp_path / "plain.tsv"
    plain.write_text("a dog on grass\tx/1.jpg\n")
    assert main(["edits", "generate", "--in", str(plain), "--out", str(tmp_path / "p.sqlite")]) == 2
    assert "--decompositions" in capsys.readouterr().err


def _jsonl(path, decs):
    path.write_text("".join(json.dumps({"id": f"img{i}", "caption": d.caption, "decomposition": d.to_dict()}) + "\n"
                            for i, d in enumerate(decs)))
    return path


def test_llm_writer_validates_retries_and_falls_back_flagged(tmp_path, capsys):
    from fake_llm import FakeLLM
    tries: dict[str, int] = {}

    def answer(user: str) -> str:
        q = json.loads(user)
        tries[q["caption"]] = tries.get(q["caption"], 0) + 1
        if q["caption"] == CORPUS[2].caption:
            return "I would rather not."  # never valid: the rule writer's instruction, flagged
        if q["caption"] == CORPUS[3].caption and tries[q["caption"]] == 1:
            return json.dumps({"instruction": "something unrelated entirely"})  # not grounded: asked again
        words = q.get("new") or q.get("phrase")
        return "```json\n" + json.dumps({"instruction": f"please {q['kind']} {words}"}) + "\n```"

    inp, out = _jsonl(tmp_path / "caps.jsonl", CORPUS), tmp_path / "e.sqlite"
    with FakeLLM(answer=answer) as server:
        args = ["edits", "generate", "--in", str(inp), "--out", str(out), "--writer", "llm", "--llm-url", server.url,
                "--retries", "2", "--backoff", "0.01"]
        assert main(args) == 0
    printed = capsys.readouterr().out
    assert "1 flagged" in printed and "error:ungrounded=1" in printed and "error:invalid_json=3" in printed
    with EditStore(out) as store:
        (sid,) = store.settings()
        records = {r.source_caption: r for r in store.records(sid)}
    assert len(records) == len(CORPUS) and tries[CORPUS[3].caption] == 2 and tries[CORPUS[2].caption] == 3
    for caption, r in records.items():
        if caption == CORPUS[2].caption:
            assert r.flag.startswith("llm failed after 3 tries (invalid_json)") and not r.instruction.startswith("please")
        else:
            assert r.instruction.startswith(f"please {r.kind}") and not r.flag
    with FakeLLM() as server:  # a server that refuses the key: the job stops instead of falling back
        server.script.default_factory = lambda: ["401"]
        assert main(["edits", "generate", "--in", str(inp), "--out", str(tmp_path / "x.sqlite"), "--writer", "llm",
                     "--llm-url", server.url]) == 2
    assert "HTTP 401" in capsys.readouterr().err


def test_rewritten_benchmark_keeps_everything_but_the_phrasing(tiny_world, tmp_path, capsys):
    """`foco edits rewrite`: the same queries, references, targets and galleries; every instruction rewritten by
    the held-out templates, none of them a world phrasing; the original kept beside it; the evaluator reads it."""
    from foco.cli import main
    from foco.edits.rule import TEMPLATES
    from foco.utils.io import read_jsonl
    from foco.world.edits import PHRASINGS
    from foco.world.manifest import load_benchmark
    out = tmp_path / "heldout"
    assert main(["edits", "rewrite", "--root", str(tiny_world), "--split", "test", "--out", str(out)]) == 0
    heldout = [t.split("{")[0] for ts in TEMPLATES["heldout"].values() for t in ts if t.split("{")[0].strip()]
    world_starts = [t.split("{")[0] for ts in PHRASINGS.values() for t in ts if t.split("{")[0].strip()]
    for proto in ("single", "multi"):
        old = read_jsonl(tiny_world / "benchmarks" / "test" / proto / "queries.jsonl")
        new = read_jsonl(out / "benchmarks" / "test" / proto / "queries.jsonl")
        drop = ("modification", "original_modification")
        assert [{k: v for k, v in q.items() if k not in drop} for q in new] == \
            [{k: v for k, v in q.items() if k not in drop} for q in old]
        assert [q["original_modification"] for q in new] == [q["modification"] for q in old]
        for q in new:
            m = q["modification"]
            assert m != q["original_modification"] and not any(m.startswith(s) for s in world_starts), m
            assert any(m.startswith(s) for s in heldout) or m.split()[-1] == "please", m
        a, b = load_benchmark(tiny_world, "test", proto), load_benchmark(out, "test", proto)
        assert (a.query_ids, a.references, a.targets, a.gallery_ids) == (b.query_ids, b.references, b.targets,
                                                                          b.gallery_ids)
        assert all(p.is_file() for p in b.gallery_images[:3])
    with pytest.raises(ValueError, match="source world"):
        from foco.world.rewrite import rewrite_benchmark
        from foco.edits.rule import RuleWriter
        rewrite_benchmark(tiny_world, "test", tiny_world, RuleWriter("heldout"))
