"""The test suite never writes into the user's home (settings, models, caches).

``tests/conftest.py`` gives the session and each test a temporary home. This runs GUI
tests that write the widget's settings, dock widgets (napari saves its settings) and
open slides in a child pytest whose ``HOME`` is an empty folder, with no XDG or napari
variables set, as on a contributor's machine; the folder must still be empty after.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gui

ROOT = Path(__file__).parents[2]
#: Variables that name a home, config or cache folder: none reaches the child.
HOME_VARS = {
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "NAPARI_CONFIG",
    "MPLCONFIGDIR",
    "SLIDESCOPE_CACHE",
}
GUI_TESTS = [
    "tests/_qt/test_widget_ux.py::test_settings_survive_closing_and_reopening_the_widget",
    "tests/_qt/test_launcher.py::test_launcher_opens_slide_and_docks_widget",
    "tests/_qt/test_widget.py::test_export_buttons_write_geojson_and_csv",
]


def test_gui_tests_leave_the_home_folder_untouched(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in HOME_VARS}
    env["HOME"] = str(home)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GUI_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(GUI_TESTS)} passed" in proc.stdout, proc.stdout[-2000:]
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert written == [], f"the tests wrote into the home folder: {written[:20]}"
