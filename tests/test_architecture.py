"""The GUI-free rule: the core imports neither napari nor Qt."""

import subprocess
import sys

CORE = [
    "napari_slidescope",
    "napari_slidescope.slide",
    "napari_slidescope.sample_data",
    "napari_slidescope.pipeline.regions",
]

BLOCKER = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        root = name.split('.')[0]
        if root in {'napari', 'qtpy', 'PyQt5', 'PyQt6', 'PySide2', 'PySide6',
                    'magicgui', 'superqt', 'vispy'}:
            raise ImportError(f'core imported GUI package {name}')
sys.meta_path.insert(0, Block())
import pkgutil, napari_slidescope
for mod in pkgutil.walk_packages(napari_slidescope.__path__, 'napari_slidescope.'):
    if mod.name.startswith(('napari_slidescope._napari', 'napari_slidescope._qt')):
        continue
    importlib.import_module(mod.name)
import napari_slidescope as s
for name in s.__all__:
    getattr(s, name)
print('ok')
"""


def test_core_imports_without_gui_packages():
    out = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_linter_contracts():
    from pathlib import Path

    root = Path(__file__).parents[1]
    exe = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(exe)], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_core_type_checks():
    """mypy over the GUI-free core (the files listed in pyproject's [tool.mypy])."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=root, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
