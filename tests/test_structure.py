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


def _circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def test_no_import_circles_in_src():
    """No module of the package imports itself back, through any chain of imports.

    grimp reads every import statement, function-local and ``TYPE_CHECKING`` ones included:
    an import deferred into a function still runs, so it closes a circle as surely.
    """
    import grimp

    graph = grimp.build_graph("napari_slidescope", cache_dir=None)
    circles = _circles(graph)
    for circle in circles:
        members = set(circle)
        print(" <-> ".join(circle))
        for m in circle:
            for t in sorted(graph.find_modules_directly_imported_by(m) & members):
                for d in graph.get_import_details(importer=m, imported=t):
                    print(f"    {m}:{d['line_number']}: {d['line_contents']}")
    assert not circles, f"{len(circles)} import circles (run pytest -s to see the imports)"


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The check above can fail: two modules that import each other (one from a function)."""
    import grimp

    pkg = tmp_path / "circ_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ_pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from circ_pkg import a\n")
    (pkg / "c.py").write_text("from circ_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circ_pkg", cache_dir=None)
    assert _circles(graph) == [["circ_pkg.a", "circ_pkg.b"]]


#: The deprecated re-export of :mod:`napari_slidescope.errors`, kept for old imports only.
SHIMS = ("napari_slidescope.slide.errors",)


def test_the_package_imports_errors_from_their_home():
    """No module imports SlideError or SlidescopeWarning through a deprecated re-export."""
    import grimp

    graph = grimp.build_graph("napari_slidescope", cache_dir=None)
    users = {m for shim in SHIMS for m in graph.find_modules_that_directly_import(shim)}
    assert users <= set(SHIMS), sorted(users - set(SHIMS))
