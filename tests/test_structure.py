"""The floor plan: one home per thing, and no import circles in ``src/``."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_version_has_one_home():
    """pyproject's version is the one ``napari_slidescope._version`` holds and the package shows."""
    import napari_slidescope
    from napari_slidescope._version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__ == napari_slidescope.__version__
