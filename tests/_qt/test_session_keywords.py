"""The session's run() keyword that carries a NucleiRun is called nuclei_run."""

from __future__ import annotations

import pytest

from napari_slidescope._qt.session import _nuclei_run_keyword


def test_old_keyword_still_works_with_a_deprecation_warning() -> None:
    given = {"segmenter": "builtin"}
    assert _nuclei_run_keyword(given, None) is given
    with pytest.warns(DeprecationWarning, match="nuclei_run"):
        assert _nuclei_run_keyword(None, given) is given
    with pytest.raises(TypeError, match="both nuclei_run and nuclei_options"):
        _nuclei_run_keyword(given, given)
