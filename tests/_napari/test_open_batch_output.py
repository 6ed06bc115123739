"""A batch output opens in napari as batch.md says: by folder or nuclei.parquet, plugin given or
for the Parquet file, left to napari's choice (napari's own default reader cannot read either)."""

from __future__ import annotations

import pytest
from tests._napari.test_batch_results import batch_folder  # noqa: F401 - the fixture


@pytest.mark.parametrize(
    ("what", "plugin"),
    [
        ("folder", "napari-slidescope"),
        ("nuclei.parquet", "napari-slidescope"),
        ("nuclei.parquet", None),
    ],
)
def test_batch_output_opens_as_the_guide_says(make_napari_viewer, batch_folder, plugin, what):  # noqa: F811
    viewer = make_napari_viewer()
    path = batch_folder if what == "folder" else batch_folder / what
    layers = viewer.open(str(path), plugin=plugin)
    names = [layer.name for layer in layers]
    assert "small.svs nuclei" in names
    assert len(layers[names.index("small.svs nuclei")].features) > 0
