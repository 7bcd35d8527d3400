"""One record schema per artifact kind: every field a reader of foco's own files relies on, with its type and range.

Each reader reads its record through `read(kind, path)` (or `check(kind, value, path)` for one it already holds),
so a damaged record (a field of another type, NaN, a huge or negative number, a missing field) is refused naming
the file and the field, before any of it is used. The kinds are those of `foco.utils.ownership.KINDS`, and the
record files inside them:

=======================  =====================================================================================
world                    world.json (counts and sha256 of every manifest; `foco.world.manifest` checks both)
feature cache            manifest.json; each shard's images/shard-NNNNN.json; a corpus's corpus.json
FoCo checkpoint          foco.json (the model config; what training recorded: the backbone, the edit stage)
search index             index.json
trained mappers          pic2word.json, lincir.json, searle.json, context_i2w.json, composer.json (their
                         backbone records); tat.json (SlerpTAT); oti.json (SEARLE's inverted tokens)
decomposition / edits    SQLite stores: their tables (`foco.decompose.store.STORE_TABLES`); the runs' settings
=======================  =====================================================================================
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .utils.schema import COUNT, HEX16, HEX64, Field, check as _check, opt, read_record

MAX_DIM = 1 << 16  # the widest joint space a record may declare (ViT-bigG is 1,280)
RATIO = Field("float", lo=0.0, hi=64.0)
SPEC = Field("str", lo=1, hi=4096)
BACKBONE_RECORD = Field("str|dict", fields={"spec": Field("str", lo=1, hi=4096, nullable=True),
                                            "weights_sha256": opt(HEX64)})


_CONFIG_FLOATS = ("aggr_mlp_ratio", "comp_mlp_ratio", "aggr_block_ffn_ratio", "aggr_ffn_ratio", "map_mlp_ratio",
                  "init_temperature", "init_bias", "background_dropout")


def _divisible(cfg: dict) -> str | None:
    if cfg.get("dim", 1) % cfg.get("heads", 1):
        return f"dim {cfg['dim']} is not a multiple of heads {cfg['heads']}"
    # foco writes every float field of the config as a float (asdict of FoCoConfig): an int there was not written
    # by foco, and fields such as init_temperature change no weight's shape, so nothing else would notice
    ints = [k for k in _CONFIG_FLOATS if type(cfg.get(k)) is int]
    if ints:
        return f"{', '.join(f'{k} holds the int {cfg[k]}' for k in ints)}, where foco writes a float"
    return None


def _model_config() -> Field:
    """FoCoConfig's fields (the model checks the names of its variants itself when it is built from them)."""
    name = Field("str", lo=1, hi=64, optional=True)
    return Field("dict", rule=_divisible, fields={
        "dim": Field("int", lo=1, hi=MAX_DIM), "heads": Field("int", lo=1, hi=1024),
        "comp_depth": Field("int", lo=1, hi=256),
        **{k: RATIO for k in ("aggr_mlp_ratio", "comp_mlp_ratio")},
        **{k: Field("float", lo=0.0, hi=64.0, optional=True) for k in ("aggr_block_ffn_ratio", "aggr_ffn_ratio",
                                                                          "map_mlp_ratio")},
        "use_background": Field("bool", optional=True), "anchor_init": Field("bool", optional=True),
        "aggr_query": name, "aggr_attention": name, "background": name, "comp_layers": name, "focus": name,
        "init_temperature": Field("float", lo=1e-6, hi=1e4, optional=True),
        "learn_bias": Field("bool", optional=True), "init_bias": Field("float", lo=-1e4, hi=1e4, optional=True),
        "background_dropout": Field("float", lo=0.0, hi=0.99, optional=True)})


def _checkpoint() -> Field:
    return Field("dict", fields={
        "model": Field("str", choices=("foco",)), "config": _model_config(), "weights_sha256": opt(HEX64),
        "train": Field("dict", optional=True, fields={
            "stage3_epochs": Field("int", lo=0, hi=1 << 20, optional=True),
            "seed": Field("int", lo=0, optional=True)}),
        "backbone": opt(BACKBONE_RECORD),
        "provenance": Field("dict", optional=True, fields={"backbone": opt(BACKBONE_RECORD)})})


def _sizes(cfg: dict) -> str | None:
    """A module config's numbers: widths, counts and rates are never negative, and none is beyond 2**20."""
    for k, v in cfg.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not 0 <= v <= 1 << 20:
            return f"{k} is {v}, outside [0, {1 << 20}]"
        if isinstance(v, list) and any(isinstance(x, (int, float)) and not isinstance(x, bool)
                                       and not 0 <= x <= 1 << 20 for x in v):
            return f"{k} holds a number outside [0, {1 << 20}]"
    return None


MODULE_CONFIG = Field("dict", items=Field("int|float|str|bool|list|dict", nullable=True), rule=_sizes)


def _mapper(key: str) -> Field:
    """A trained mapper's record: `key` names what it is ("model": pic2word, lincir; "mapper": PACT, TSCIR)."""
    return Field("dict", fields={key: Field("str", lo=1, hi=64), "backbone": opt(BACKBONE_RECORD),
                                 "config": Field("dict", optional=True, items=MODULE_CONFIG.items, rule=_sizes),
                                 "mapper_config": Field("dict", optional=True, items=MODULE_CONFIG.items, rule=_sizes),
                                 "text": Field("dict", optional=True),
                                 "provenance": Field("dict", optional=True, fields={"backbone": opt(BACKBONE_RECORD)})})


_KIND_ENTRY = Field("dict", fields={"count": COUNT, "fingerprint": HEX16, "ids_fingerprint": opt(HEX16),
                                    "content_sha256": opt(HEX64)})


def _cache_manifest() -> Field:
    return Field("dict", fields={
        "backbone": SPEC, "backbone_sha256": opt(HEX64), "embed_dim": Field("int", lo=1, hi=MAX_DIM),
        "dtype": Field("str", choices=("float16", "bfloat16", "float32")),
        "shard_size": Field("int", lo=1, hi=1 << 30), "precision": Field("str", choices=("fp32", "bf16", "fp16"),
                                                                         optional=True),
        "source": Field("dict", optional=True, nullable=True),
        "images": Field("dict", optional=True, fields=_KIND_ENTRY.fields),
        "texts": Field("dict", optional=True, fields=_KIND_ENTRY.fields)})


SHARD = Field("dict", fields={"ids": Field("list", items=Field("str|int")), "sha256": opt(HEX64),
                              "ids_sha256": opt(HEX64), "bytes": Field("int", lo=0, optional=True),
                              "mtime_ns": Field("int", optional=True)})

CORPUS = Field("dict", fields={"backbone": SPEC, "backbone_sha256": opt(HEX64),
                               "parts": Field("list", items=Field("str|dict"))})


def _index() -> Field:
    return Field("dict", fields={
        "format_version": Field("int", lo=0, hi=1 << 16), "images": Field("str", lo=1, hi=1 << 16),
        "backbone": SPEC, "backbone_sha256": opt(HEX64), "index_type": Field("str", lo=1, hi=256),
        "with_patches": Field("bool"), "precision": Field("str", choices=("fp32", "bf16", "fp16")),
        "train_size": opt(Field("int", lo=1, hi=1 << 40)), "max_index_memory": opt(Field("str|int", lo=0, hi=1 << 50)),
        "dim": Field("int", lo=1, hi=MAX_DIM, optional=True), "count": Field("int", lo=0, hi=1 << 40, optional=True),
        "building": Field("bool", optional=True),
        "files": Field("dict", optional=True, items=Field("dict", fields={
            "sha256": HEX64, "bytes": Field("int", lo=0), "mtime_ns": Field("int")})),
        "vectors": opt(Field("dict", fields={"factory": Field("str", lo=1, hi=256), "ondisk": Field("bool"),
                                             "refine": Field("int", lo=0, hi=1 << 16, optional=True),
                                             "refine_asked": opt(Field("int", lo=0, hi=1 << 16))}))})


WORLD_BACKBONE = Field("dict", fields={
    "backbone": Field("str", choices=("world",)), "weights_sha256": opt(HEX64),
    "config": Field("dict", rule=_sizes, fields={
        "image_size": Field("int", lo=8, hi=4096), "widths": Field("list", lo=3, hi=3, items=Field("int", lo=1)),
        "embed_dim": Field("int", lo=1, hi=MAX_DIM), "pool_heads": Field("int", lo=1, hi=256),
        "text_width": Field("int", lo=1, hi=MAX_DIM), "text_layers": Field("int", lo=1, hi=256),
        "text_heads": Field("int", lo=1, hi=256), "max_text_len": Field("int", lo=2, hi=1 << 16),
        "text_encoder": Field("str", lo=1, hi=4096), "image_tower": Field("str", lo=1, hi=16, optional=True),
        **{k: Field("int", lo=1, hi=MAX_DIM, optional=True) for k in ("patch_size", "vit_width", "vit_layers",
                                                                       "vit_heads")}})})

TRAINING_STATE = Field("dict", fields={
    "progress": Field("dict", fields={"epoch": Field("int", lo=0, optional=True),
                                      "step": Field("int", lo=0, optional=True),
                                      "logs": opt(Field("dict", items=Field("int", lo=0))),
                                      "identity": opt(Field("dict")), "settings": opt(Field("dict|list"))}),
    "optimizer": Field("dict"), "tensors_sha256": opt(HEX64), "numpy_rng": opt(Field("dict"))})

WORLD = Field("dict", fields={
    "format_version": Field("int", lo=0, hi=1 << 16), "image_size": Field("int", lo=8, hi=1 << 14),
    "config": Field("dict", fields={"seed": Field("int", lo=0, optional=True)}),
    "counts": Field("dict", items=COUNT), "manifests_sha256": Field("dict", items=HEX64, optional=True)})

TAT = Field("dict", fields={
    "base": Field("dict", fields={"spec": Field("str", lo=3, hi=4096, pattern=r"[a-z]+:.+"),
                                  "weights_sha256": opt(HEX64)}),
    "backbone": BACKBONE_RECORD, "adapter_sha256": HEX64,
    "lora": Field("dict", fields={"rank": Field("int", lo=1, hi=1 << 16), "alpha": Field("float", lo=1e-6, hi=1e6),
                                  "targets": Field("list", lo=1, hi=256, items=Field("str", lo=1, hi=256))})})

OTI = Field("dict", fields={
    "model": Field("str", choices=("searle-oti",)), "backbone": SPEC, "images": Field("int", lo=1, hi=1 << 40),
    "concepts": Field("list", lo=1, hi=1 << 20, items=Field("str", lo=1, hi=256)), "settings": Field("dict")})

SCHEMAS: dict[str, Any] = {
    "foco.json": _checkpoint, "pic2word.json": lambda: _mapper("model"), "lincir.json": lambda: _mapper("model"),
    "searle.json": lambda: _mapper("model"), "context_i2w.json": lambda: _mapper("model"), "oti.json": lambda: OTI,
    "composer.json": lambda: _mapper("mapper"), "manifest.json": _cache_manifest, "shard": lambda: SHARD,
    "corpus.json": lambda: CORPUS, "index.json": _index, "world.json": lambda: WORLD,
    "config.json": lambda: WORLD_BACKBONE, "state.json": lambda: TRAINING_STATE, "tat.json": lambda: TAT}

FIXES = {"foco.json": "retrain the checkpoint (`foco train`) or restore its foco.json",
         "pic2word.json": "retrain it (`foco pic2word train`)", "lincir.json": "retrain it (`foco lincir train`)",
         "searle.json": "retrain it (`foco searle train`)",
         "context_i2w.json": "retrain it (`foco context-i2w train`)", "oti.json": "run the inversion again (`foco searle oti`)",
         "composer.json": "retrain it", "manifest.json": "extract the features again into a new --out",
         "shard": "extract the features again into a new --out (`foco features extract`)",
         "corpus.json": "extract the corpus again into a new --out", "index.json": "build the index again into a new "
         "--out (`foco index build`)", "world.json": "regenerate the world (`foco world generate`)",
         "config.json": "retrain the backbone (`foco backbone train`), or reinstall foco for a shipped one",
         "state.json": "the training state is damaged: remove its train_state folder to start the run again",
         "tat.json": "retune it (`foco tat train`)"}


def read(kind: str, path: str | Path) -> dict:
    """The record `kind` ("foco.json", "index.json", ...: `SCHEMAS`) at `path`, read and checked."""
    return read_record(path, SCHEMAS[kind](), FIXES[kind])


def built(path: str | Path, build):
    """`build()` (a module made from the record at `path`), with any failure of the record's values to build one
    (a width the layers refuse, a name they do not know) a RecordError naming the file."""
    from .utils.schema import RecordError
    try:
        return build()
    except (ValueError, TypeError, KeyError, RuntimeError, OverflowError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"{path}: its config does not build the model ({type(exc).__name__}: {exc}); the record "
                          f"is damaged; {FIXES.get(Path(path).name, 'retrain it')}") from None


def check(kind: str, value: Any, path: str | Path) -> Any:
    """`value`, a record of `kind` already read from `path`, checked."""
    return _check(value, SCHEMAS[kind](), path, FIXES[kind])
