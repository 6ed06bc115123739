"""The ``slidescope`` command: ``slidescope batch SLIDE_OR_FOLDER... -o OUT``.

Exit status: 0 when every slide succeeded, 1 when any failed (the others still
finished and were written), 2 for bad usage (unknown option, no slides, output not
writable, unknown segmenter, unreachable scheduler), with a one-line message.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["main"]

_EPILOG = """\
outputs, in OUT/<slide file name>/:
  nuclei.parquet     GeoParquet, one row per nucleus: id, outline (WKB polygon, level-0 px),
                     centroid (level-0 px and µm), bounding box, measurements (µm, µm², OD)
  nuclei.geojson.gz  the nuclei as QuPath detections (drag it onto the slide in QuPath)
  tissue.geojson     the tissue as QuPath annotations
  manifest.json      slide size, time and hash, parameters, tile grid, each tile's status
and OUT/summary.csv: one row per slide (status, error, tissue mm², nuclei, nuclei per mm²,
mean nucleus area µm², seconds).

exit status: 0 all slides done, 1 some failed (the others are written), 2 bad usage.

examples:
  slidescope batch cohort/ -o results/ --workers 8
  slidescope batch cohort/ -o results/ --resume                 # after an interruption
  slidescope batch big.svs -o results/ --scheduler tcp://head-node:8786
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Exit 2 with one line (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _tasks(text: str) -> tuple[str, ...]:
    from napari_slidescope.batch.params import TASKS

    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(TASKS)}, got {text!r}")
    return tasks


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slidescope", description="napari-slidescope on the command line.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    b = sub.add_parser(
        "batch",
        help="analyse slides (files or folders) on a dask.distributed cluster",
        description=(
            "Find the tissue and segment the nuclei of many slides, or of one huge slide, "
            "on a dask.distributed cluster (local worker processes, or an existing cluster). "
            "Resumable: with --resume, what an earlier run into OUT finished is kept."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "inputs",
        nargs="+",
        metavar="SLIDE_OR_FOLDER",
        help="slide files, and folders searched (recursively) for .svs .ndpi .qptiff .scn .bif "
        ".tif .tiff .ome.tif .ome.tiff",
    )
    b.add_argument("-o", "--out", required=True, metavar="OUT", help="output folder (created)")
    b.add_argument(
        "--tasks",
        type=_tasks,
        default=("tissue", "nuclei"),
        metavar="LIST",
        help="comma-separated: tissue, nuclei (nuclei implies tissue; default: tissue,nuclei)",
    )
    b.add_argument(
        "--segmenter",
        default="auto",
        metavar="NAME",
        help="nuclei segmenter: auto (per slide, the learned model for its stain when "
        "installed, else the built-in method), builtin, instanseg, stardist, cellpose "
        "(default: auto)",
    )
    where = b.add_mutually_exclusive_group()
    where.add_argument(
        "--workers",
        type=_positive(int),
        metavar="N",
        help="start a local cluster of N worker processes, one thread each "
        f"(default: one per core, {os.cpu_count()} here)",
    )
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="use the running cluster at this scheduler address, e.g. tcp://host:8786 "
        "(started by `dask scheduler` and `dask worker`, dask-jobqueue, ...)",
    )
    b.add_argument(
        "--resume",
        action="store_true",
        help="keep slides and tiles an earlier run into OUT finished with the same slide file "
        "and parameters; redo the rest (default: redo everything)",
    )
    b.add_argument(
        "--nuclei-mpp",
        type=_positive(float),
        metavar="UM",
        help="working resolution of the nuclei segmentation in µm per pixel (default: the "
        "segmenter's, e.g. 0.25 for builtin, never finer than the slide's pixels)",
    )
    b.add_argument(
        "--tile-size-um",
        type=_positive(float),
        default=512.0,
        metavar="UM",
        help="size in µm of the part of a slide each nuclei task owns; tiles add the "
        "segmenter's overlap (default: 512)",
    )
    b.add_argument(
        "--tiles-per-task",
        type=_positive(int),
        metavar="N",
        help="tiles per nuclei task; more means fewer tasks for the scheduler "
        "(default: 1, or 8 with --gpu)",
    )
    b.add_argument(
        "--retries",
        type=int,
        default=1,
        metavar="N",
        help="times a failing task is re-run before its slide counts as failed (default: 1)",
    )
    b.add_argument(
        "--gpu",
        action="store_true",
        help="run nuclei tasks only on workers with a GPU resource (`dask worker "
        '--resources "GPU=1"`), one at a time per GPU, reading and post-processing on '
        "CPU threads of that worker while the model runs (default: off)",
    )
    b.add_argument(
        "--cell-expansion-um",
        type=_positive(float),
        metavar="UM",
        help="grow each nucleus into a cell by up to UM µm, never into a neighbour; tables "
        "gain {channel}_{nucleus,cytoplasm,cell}_mean (default: nuclei only)",
    )
    b.add_argument(
        "--classify",
        metavar="FILE",
        help="classify each slide's cells: a phenotype rules JSON file (saved by the widget, "
        "or PhenotypeRules.save) or a learned classifier's file; adds a class column, "
        "QuPath classes and per-class counts / H-score to summary.csv (default: none)",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``slidescope`` command; return its exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 all slides done, 1 some failed, 2 bad usage.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    prog = "slidescope batch"
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    try:
        code = _batch(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run again with --resume to continue", file=sys.stderr)
        return 130
    except _Usage as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return code


class _Usage(Exception):
    """Bad usage found before any slide ran."""


def _batch(args: argparse.Namespace) -> int:
    from napari_slidescope.batch.engine import analyze_slides
    from napari_slidescope.batch.params import (
        BatchParams,
        check_writable,
        find_slides,
        output_names,
    )

    try:
        params = BatchParams(args.tasks, args.segmenter, args.nuclei_mpp, args.tile_size_um)
        if args.classify is not None:  # a bad rules file stops here, before any work
            from napari_slidescope.pipeline.classify import load_classification

            load_classification(args.classify)
        if params.nuclei:
            from napari_slidescope.segmenters import missing_reason

            reason = missing_reason(args.segmenter)
            if reason is not None:
                raise _Usage(f"segmenter {args.segmenter!r} is not available: {reason}")
        slides = find_slides(args.inputs)
        if not slides:
            raise _Usage(f"no slides found in {' '.join(args.inputs)}")
        output_names(slides)
        check_writable(args.out)
    except KeyError as exc:
        raise _Usage(str(exc.args[0]) if exc.args else str(exc)) from None
    except (ValueError, OSError) as exc:
        raise _Usage(_one_line(exc)) from None

    client = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout=20)
        except (OSError, TimeoutError) as exc:
            raise _Usage(
                f"cannot reach the scheduler at {args.scheduler}: {_one_line(exc)}"
            ) from None
    view = _Progress(len(slides), enabled=not args.no_progress)
    try:
        with view:
            rows = analyze_slides(
                slides,
                args.out,
                tasks=params.tasks,
                segmenter=args.segmenter,
                nuclei_mpp=args.nuclei_mpp,
                tile_size_um=args.tile_size_um,
                cell_expansion_um=args.cell_expansion_um,
                classify=args.classify,
                client=client,
                workers=args.workers,
                resume=args.resume,
                retries=max(0, args.retries),
                tiles_per_task=args.tiles_per_task,
                gpu=args.gpu,
                progress=view.update,
            )
    finally:
        if client is not None:
            client.close()
    failed = [r for r in rows if r.get("status") != "done"]
    print(
        f"{len(rows)} slide(s): {len(rows) - len(failed)} done, {len(failed)} failed; "
        f"summary: {os.path.join(args.out, 'summary.csv')}"
    )
    return 1 if failed else 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _slide_line(row: dict[str, Any]) -> str:
    if row.get("status") != "done":
        return f"FAILED {row['slide']}: {row.get('error')}"
    parts = [f"done   {row['slide']}"]
    if row.get("tissue_area_mm2") is not None:
        parts.append(f"tissue {row['tissue_area_mm2']:.2f} mm²")
    if row.get("nuclei") is not None:
        parts.append(f"{row['nuclei']} nuclei")
    if row.get("seconds") is not None:
        parts.append(f"{row['seconds']:.1f} s")
    return ", ".join(parts)


class _Progress:
    """Slides and tiles bars (rich) and one line per finished slide."""

    def __init__(self, slides: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description:<7}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.slides = self.bar.add_task("slides", total=slides, rate="")
            self.tiles = self.bar.add_task("tiles", total=None, rate="")

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, state: Any) -> None:
        if state.finished is not None:
            line = _slide_line(state.finished)
            if self.bar is not None:
                self.bar.console.print(line, markup=False, highlight=False)
            else:
                print(line, flush=True)
        if self.bar is None:
            return
        self.bar.update(self.slides, completed=state.slides_done)
        task = self.bar.tasks[self.tiles]
        speed = task.speed
        self.bar.update(
            self.tiles,
            completed=state.tiles_done,
            total=state.tiles_total or None,
            rate=f"{speed:.2f} tiles/s" if speed else "",
        )
