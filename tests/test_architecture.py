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


#: The per-module checks `mypy --strict` turns on (mypy's own list; its global ones,
#: warn_unused_ignores and warn_redundant_casts, are checked below).
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}
#: The public modules held to --strict (pipeline and batch join when their splits land).
STRICT_MODULES = {
    "napari_slidescope",
    "napari_slidescope.errors",
    "napari_slidescope.slide.*",
    "napari_slidescope.analysis.*",
    "napari_slidescope.segmenters.*",
}


def test_public_modules_are_type_checked_strictly():
    """test_core_type_checks runs mypy with these flags on these modules (pyproject)."""
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]
    mypy = config["mypy"]
    assert mypy["warn_unused_ignores"] is True
    assert mypy["warn_redundant_casts"] is True
    strict = [o for o in mypy.get("overrides", []) if STRICT_FLAGS <= set(o)]
    assert len(strict) == 1, f"expected one override with --strict's flags, got {len(strict)}"
    off = sorted(flag for flag in STRICT_FLAGS if strict[0][flag] is not True)
    assert not off, f"strict override does not turn on: {off}"
    missing = sorted(STRICT_MODULES - set(strict[0]["module"]))
    assert not missing, f"public modules missing from the strict override: {missing}"
    files = set(mypy["files"])
    for package in ("slide", "analysis", "segmenters"):
        assert f"src/napari_slidescope/{package}" in files, f"{package} is not type-checked"
    assert "src/napari_slidescope/errors.py" in files
