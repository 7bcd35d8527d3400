"""`import foco` works with torch and numpy alone: every heavier dependency is imported lazily."""
import subprocess
import sys

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'PIL', 'transformers', 'safetensors', 'tqdm', 'faiss', 'spacy', 'fastapi'}:
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import foco, foco.metrics, foco.backbones.base
print(sorted(m for m in sys.modules if m.split('.')[0] in {'PIL', 'transformers', 'safetensors', 'tqdm'}))
"""


def test_core_imports_with_torch_and_numpy_only():
    out = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
