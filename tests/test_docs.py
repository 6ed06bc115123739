"""The documentation site builds with warnings as errors: a broken docstring fails here.

CI runs only the README's test command, so the docs build is a test: Sphinx with numpydoc
renders the API reference from the docstrings and the user guide from ``docs/guide``
(which includes the README's sections between its ``<!-- ...:start/end -->`` markers).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    cmd += ["-d", str(tmp / "doctrees"), str(ROOT / "docs"), str(tmp / "html")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return out, tmp / "html"


def test_docs_build_without_warnings(build):
    out, html = build
    assert out.returncode == 0, f"sphinx failed (status {out.returncode}):\n{out.stderr}"
    for page in ("index", "api/index", "guide/install", "guide/benchmarks"):
        assert (html / f"{page}.html").is_file(), f"{page}.html was not built"


@pytest.mark.parametrize(
    ("page", "names"),
    [
        ("slides", ["open_slide", "Slide", "Slide.read_region", "ArraySlide"]),
        ("tissue", ["detect_tissue", "TissueResult"]),
        ("nuclei", ["segment_nuclei", "NucleiResult"]),
        ("classify", ["classify_cells", "class_summary", "train_classifier", "load_classifier"]),
        ("samples", ["write_sample_slide", "write_ki67_sample", "write_multiplex_sample"]),
        ("batch", ["analyze_slides"]),
        (
            "regions",
            ["train_region_classifier", "classify_regions", "RegionMap", "assign_regions"],
        ),
        (
            "tiles",
            ["tile_slide", "TileTable", "iter_tiles", "TileDataset", "embed_tiles"],
        ),
        ("errors", ["errors.SlidescopeWarning", "errors.SlideError", "errors.Cancelled"]),
    ],
)
def test_api_reference_documents_the_public_names(build, page, names):
    """Each public name has an entry (a rendered signature) in its reference page."""
    _, html = build
    text = (html / "api" / f"{page}.html").read_text(encoding="utf-8")
    missing = [n for n in names if f'id="napari_slidescope.{n}"' not in text]
    assert not missing, f"not documented in api/{page}.html: {missing}"
