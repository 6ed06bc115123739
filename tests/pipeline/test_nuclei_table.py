"""``result.table`` is a pandas DataFrame (issue 36 item 5); the numpy columns stay beside it."""

import dataclasses

import numpy as np
import pandas as pd

from napari_slidescope import classify_cells
from napari_slidescope.pipeline.nuclei_result import NucleiResult


def _result(n=50):
    rng = np.random.default_rng(0)
    cols = {
        "id": np.arange(1, n + 1),
        "centroid_row": rng.uniform(0, 100, n),
        "centroid_col": rng.uniform(0, 100, n),
        "area_um2": rng.uniform(10, 60, n),
        "dab_od_mean": rng.uniform(0, 0.8, n),
    }
    return NucleiResult(
        np.zeros((100, 100), np.int32), 0.5, (0, 0), (1.0, 1.0), n, cols, (0, 0, 100, 100)
    )


def test_table_is_a_dataframe_of_the_columns():
    res = _result()
    table = res.table
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == list(res.columns)
    assert len(table) == res.count
    assert np.array_equal(table["area_um2"].to_numpy(), res.columns["area_um2"])
    assert res.table is table  # built once
    assert res.to_pandas() is table


def test_print_stays_short_and_classes_reach_the_table():
    res = _result(5000)
    text = repr(res)
    assert len(text) < 300 and "array" not in text
    out = classify_cells(res, dab=True)
    assert isinstance(out.table, pd.DataFrame)
    assert set(out.table["class"]) <= {"Negative", "1+", "2+", "3+"}
    assert "class" not in res.table  # the input is unchanged: a frozen value
    assert dataclasses.replace(out, columns={"id": np.arange(2)}).table.shape == (2, 1)
