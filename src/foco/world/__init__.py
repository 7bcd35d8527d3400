"""The embedded synthetic compositional world: scenes, renderer, captions, decompositions and CIR benchmarks."""
from .generate import WorldConfig, generate_world, plan_world, world_config
from .manifest import load_benchmark, load_pairs, WorldBenchmark, WorldPair
from .render import render_scene
from .scene import Scene, WorldObject

__all__ = ["WorldConfig", "generate_world", "plan_world", "world_config", "load_pairs", "load_benchmark",
           "WorldPair", "WorldBenchmark", "render_scene", "Scene", "WorldObject"]
