"""Every Python example of the README and the user guide runs as written and prints what it shows.

Each ```` ```python ```` block of ``README.md`` and ``docs/guide/*.md`` runs on its own, in
a fresh Python process whose working folder is an empty temporary one and whose home is
private (no installed models: ``segmenter="auto"`` runs the built-in methods, as on a fresh
install). The examples make their own slides with the package's sample writers
(``write_sample_slide``, ``write_ki67_sample``, ``write_multiplex_sample``), so nothing
outside the repository is needed.

Conventions of the pages:

- ``print(...)  # TEXT`` on one line: ``TEXT`` is what that print writes, and is checked
  (the printed lines, in the order of the page, must appear in the output). A print line
  without a comment may be followed by comment-only lines: the lines it prints.
- A block that cannot run here is preceded by ``<!-- skip-example: REASON -->`` (among the
  HTML comments just above its fence); the reason is shown in the test report. Keep them few.
- A block written for napari's console is preceded by ``<!-- example-setup: napari-viewer -->``:
  it runs with ``viewer = napari.Viewer(show=False)`` defined, as the console defines it,
  and needs a display (``xvfb-run``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import home_env

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
SKIP = re.compile(r"<!--\s*skip-example:\s*(.*?)\s*-->")
SETUP = re.compile(r"<!--\s*example-setup:\s*(.*?)\s*-->")
#: the optional packages an example needs (comma-separated): it runs where they are installed
#: (the Python 3.11 suite has CPU torch and ONNX Runtime) and skips, naming one, where not
REQUIRES = re.compile(r"<!--\s*example-requires:\s*(.*?)\s*-->")
#: code run before and after an example, per ``example-setup`` name
SETUPS = {
    "napari-viewer": (
        "import napari\n\nviewer = napari.Viewer(show=False)\n",
        "viewer.close()\n",
    ),
}
#: seconds one example may take (a whole-slide run on the sample under a busy machine)
TIMEOUT = 300


@dataclass(frozen=True)
class Example:
    """One ```python block: its page, first line number, code and skip reason (if any)."""

    page: Path
    line: int
    code: str
    skip: str | None
    setup: str | None = None
    requires: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The ```python blocks of a Markdown page, with the skip marker above each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            skip = setup = requires = None
            k = start - 1
            while k >= 0 and lines[k].strip().startswith("<!--"):
                if match := SKIP.search(lines[k]):
                    skip = match.group(1)
                if match := SETUP.search(lines[k]):
                    setup = match.group(1)
                if match := REQUIRES.search(lines[k]):
                    requires = match.group(1)
                k -= 1
            code = "\n".join(lines[start + 1 : j]) + "\n"
            found.append(Example(page, start + 2, code, skip, setup, requires))
            i = j
        i += 1
    return found


def expected_output(code: str) -> list[str]:
    """The lines the page says its prints write.

    The comment on a ``print(...)`` line; for a print line without one, the comment-only
    lines right below it, one printed line each.
    """
    lines = code.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    first_of_line: dict[int, tokenize.TokenInfo] = {}
    comment_of_line: dict[int, str] = {}
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            comment_of_line[tok.start[0]] = tok.string[1:].strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            first_of_line.setdefault(tok.start[0], tok)
    out = []
    for row, first in sorted(first_of_line.items()):
        if first.type != tokenize.NAME or first.string != "print":
            continue
        if row in comment_of_line:
            out.append(comment_of_line[row])
            continue
        below = row + 1
        while below <= len(lines) and lines[below - 1].strip().startswith("#"):
            out.append(comment_of_line[below])
            below += 1
    return out


ALL = [ex for page in PAGES for ex in examples(page)]
PARAMS = [
    pytest.param(ex, id=ex.name, marks=[pytest.mark.gui] if ex.setup == "napari-viewer" else [])
    for ex in ALL
]


def test_the_pages_have_examples_and_few_skips():
    """The extraction finds the pages' examples; every skip says why."""
    assert len(ALL) >= 6, [ex.name for ex in ALL]
    skipped = [ex for ex in ALL if ex.skip is not None]
    assert all(ex.skip for ex in skipped), "a skip-example marker without a reason"
    assert len(skipped) <= 4, f"too many examples skipped: {[ex.name for ex in skipped]}"
    unknown = [ex.name for ex in ALL if ex.setup is not None and ex.setup not in SETUPS]
    assert not unknown, f"example-setup names none of {sorted(SETUPS)}: {unknown}"


def test_expected_output_reads_print_comments():
    code = (
        "x = 1  # not output\nprint(x)  # 1\nprint('a  # b')  # a  # b\n# not output\n"
        "for i in (1, 2):\n    print(i)\n# 1\n# 2\n\n# not output\n"
    )
    assert expected_output(code) == ["1", "a  # b", "1", "2"]


def _run_example(script: Path, work: Path, env: dict[str, str], name: str) -> tuple[int, str, str]:
    """Run `script`; return its status, stdout and stderr.

    Past :data:`TIMEOUT` the example is hung: it gets SIGABRT, so that Python's fault
    handler writes every thread's stack to stderr (the test's failure shows where it
    waited), then its process group (its worker processes too) is killed.
    """
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        start_new_session=sys.platform != "win32",
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        if sys.platform != "win32":
            proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # its workers hold the pipes
                os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"{name} did not end within {TIMEOUT} s; it printed:\n{stdout[-2000:]}\n"
            f"its stacks:\n{stderr[-12000:]}"
        )
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize("example", PARAMS)
def test_example_runs_as_written(example: Example, tmp_path: Path):
    if example.skip is not None:
        pytest.skip(f"{example.name}: {example.skip}")
    for name in (example.requires or "").replace(",", " ").split():  # "torch, onnxruntime"
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{example.name}: needs {name}, not installed here")
    before, after = SETUPS.get(example.setup or "", ("", ""))
    display = os.environ.get("DISPLAY") or os.environ.get("QT_QPA_PLATFORM") == "offscreen"
    if before and sys.platform.startswith("linux") and not display:
        pytest.skip(f"{example.name}: runs in a napari viewer and needs a display (xvfb-run)")
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SLIDESCOPE_MODELS"}
    env.update(home_env(home))
    env["PYTHONIOENCODING"] = "utf-8"
    src = ROOT / "src"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    script = work.parent / "example.py"
    script.write_text(before + example.code + after, encoding="utf-8")
    env["PYTHONFAULTHANDLER"] = "1"  # a hung example is stopped by SIGABRT: its stacks
    returncode, stdout, stderr = _run_example(script, work, env, example.name)
    assert returncode == 0, f"{example.name} failed (status {returncode}):\n{stderr[-4000:]}"
    printed = stdout.splitlines()
    at = 0
    for want in expected_output(example.code):
        try:
            at = printed.index(want, at) + 1
        except ValueError:
            pytest.fail(
                f"{example.name}: the page shows {want!r} but the example printed:\n"
                + "\n".join(printed)
            )
