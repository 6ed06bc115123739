"""The ``slidescope`` command: ``slidescope batch SLIDE_OR_FOLDER... -o OUT``.

``slidescope models install instanseg`` and ``slidescope models list`` install the learned
models and say what is installed (:mod:`napari_slidescope.batch.models_cli`).

Exit status: 0 when every slide succeeded, 1 when any failed (the others still
finished and were written), 2 for bad usage (unknown option, no slides, output not
writable, unknown segmenter, unreachable scheduler), with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from napari_slidescope.batch.ledger import BatchProgress

from napari_slidescope._io import one_line

__all__ = ["main"]

_EPILOG = """\
outputs, in OUT/<slide file name>/:
  nuclei.parquet     GeoParquet, one row per nucleus: id, outline (WKB polygon, level-0 px),
                     centroid (level-0 px and µm), bounding box, measurements (µm, µm², OD)
  nuclei.geojson.gz  the nuclei as QuPath detections (drag it onto the slide in QuPath)
  tissue.geojson     the tissue as QuPath annotations
  regions.zarr/      (--regions) the class map, OME-NGFF labels at the classifier's µm/px
  regions.geojson    (--regions) each region class's outlines as QuPath annotations
  regions.csv        (--regions) per region: area, cells, cells per mm², cell classes
  tiles.parquet      (--tiles) the tissue tiles at --tile-mpp, GeoParquet (level-0 boxes)
  tile_embeddings.zarr/ (--embed) tiles x features, AnnData (the model file's SHA-256 in uns)
  manifest.json      slide size, time and hash, parameters and what they resolved to (the
                     segmenter that ran, its model, version and weights' SHA-256, working
                     µm/px, stain mode, nuclear channel), tile grid, each tile's status, and
                     the traceback of a failure
and OUT/summary.csv: one row per slide (status, error, tissue mm², nuclei, nuclei per mm²,
mean nucleus area µm², seconds, absolute path).

A slide that fails prints one line (FAILED <slide>: <error>); --verbose adds its traceback.
An error that would recur (a file that is not a slide, a missing model) is not retried.

exit status: 0 all slides done, 1 some failed (the others are written), 2 bad usage.

examples:
  slidescope batch cohort/ -o results/ --workers 8
  slidescope batch cohort/ -o results/ --resume                 # after an interruption
  slidescope batch big.svs -o results/ --scheduler tcp://head-node:8786
  slidescope batch cohort/ -o tiles/ --tasks tissue --tiles --embed model.onnx  # ML tiles
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Exit 2 with one line (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrap help at spaces only: a name such as ``builtin-fluorescence`` stays whole."""
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _listed_tasks() -> tuple[str, ...]:
    """Return the tasks ``--tasks`` names (not those asked for by a flag with a value)."""
    from napari_slidescope.pipeline.task_table import TASK_TABLE

    return tuple(t.name for t in TASK_TABLE if t.cli_flag is None)


def _tasks(text: str) -> tuple[str, ...]:
    known = _listed_tasks()
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in tasks if t not in known]
    if bad or not tasks:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(known)}, got {text!r}")
    return tasks


def _parser() -> argparse.ArgumentParser:
    from napari_slidescope.batch._flags import add_option_flags
    from napari_slidescope.batch.params import DEFAULT_TASKS, SLIDE_EXTENSIONS

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
        formatter_class=_Formatter,
    )
    b.add_argument(
        "inputs",
        nargs="+",
        metavar="SLIDE_OR_FOLDER",
        help="slide files, and folders searched (recursively) for "
        + " ".join(SLIDE_EXTENSIONS)
        + ", OME-Zarr images and folders of DICOM instances; slide URLs (https://, s3://, "
        "gs://, az://, any fsspec URL: workers read them, no shared disk needed) and URL "
        "prefixes ending in / (listed)",
    )
    b.add_argument("-o", "--out", required=True, metavar="OUT", help="output folder (created)")
    b.add_argument(
        "--tasks",
        type=_tasks,
        default=DEFAULT_TASKS,
        metavar="LIST",
        help=f"comma-separated: {', '.join(_listed_tasks())} (nuclei implies tissue; "
        f"default: {','.join(DEFAULT_TASKS)})",
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
        help="times a failing task is re-run before its slide counts as failed; an error "
        "that would recur (an unreadable slide, a missing model) is never re-run (default: 1)",
    )
    b.add_argument(
        "--gpu",
        action="store_true",
        help="run nuclei tasks only on workers with a GPU resource (`dask worker "
        '--resources "GPU=1"`), one at a time per GPU, reading and post-processing on '
        "CPU threads of that worker while the model runs (default: off)",
    )
    b.add_argument(
        "--storage-options",
        type=_storage_options,
        metavar="JSON",
        help="fsspec storage options for the URLs, a JSON object or @FILE holding one, e.g. "
        "'{\"anon\": true}' (default: none; credentials are best left to the environment "
        "and the store's config files; never written to outputs)",
    )
    b.add_argument(
        "--classify",
        metavar="FILE",
        help="classify each slide's cells: a phenotype rules JSON file (saved by the widget, "
        "or PhenotypeRules.save) or a learned classifier's file; adds a class column, "
        "QuPath classes and per-class counts / H-score to summary.csv (default: none)",
    )
    b.add_argument(
        "--regions",
        metavar="CLASSIFIER",
        help="classify each slide's tissue into regions with this region classifier's file "
        "(train_region_classifier(...).save); writes regions.zarr, regions.geojson and "
        "regions.csv, adds region columns to the cells and per-region figures to summary.csv; "
        "with --resume a changed classifier redoes the regions, not the nuclei (default: none)",
    )
    b.add_argument(
        "--tiles",
        action="store_true",
        help="cut each slide into tissue tiles of --tile-um µm at --tile-mpp µm/px (gated by "
        "the tissue found; --overlap-um, --min-tissue) and write tiles.parquet; with --embed "
        "MODEL (which implies --tiles) also tile_embeddings.zarr. --resume redoes only the "
        "tiles when the model file "
        "(its SHA-256) or the tiling changed (default: off)",
    )
    b.add_argument(
        "--anndata",
        action="store_true",
        help="also write cells.h5ad per slide: cells x markers for scanpy / squidpy "
        "(needs the scverse extra; default: off)",
    )
    b.add_argument(
        "--spatialdata",
        action="store_true",
        help="also write cells.zarr per slide: a SpatialData store (cell and nucleus shapes, "
        "the table linked to them) for spatialdata / squidpy / sopa. The slide is referenced "
        "(path and frame in the store's attributes), not copied, so the outputs do not grow "
        "by the size of every slide (needs the scverse extra; default: off)",
    )
    options = b.add_argument_group(
        "analysis options", "what is computed (the options model: napari_slidescope.options)"
    )
    add_option_flags(options)
    b.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown)")
    b.add_argument(
        "--dashboard",
        action="store_true",
        help="serve dask's dashboard of the local cluster on a free port and print its "
        "address (with --scheduler: print that cluster's) (default: no dashboard)",
    )
    b.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print the traceback of each failed slide, and dask's own warnings "
        "(default: one line per failed slide; tracebacks stay in its manifest.json)",
    )
    from napari_slidescope.batch import models_cli

    models_cli.add_parser(sub, _Formatter)
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
    if args.command == "models":
        from napari_slidescope.batch import models_cli

        return models_cli.run(args)
    prog = "slidescope batch"
    # dask logs each failed task with its traceback ("Compute Failed", at level error):
    # the manifest has it, and the command prints one line per failed slide
    level = "warning" if getattr(args, "verbose", False) else "critical"
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", level)
    logging.getLogger("distributed").setLevel(level.upper())
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning
    try:
        code = _batch(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run again with --resume to continue", file=sys.stderr)
        return 130
    except _Usage as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown
    return code


def _storage_options(text: str) -> dict[str, Any]:
    """``--storage-options``: a JSON object, or ``@FILE`` holding one."""
    import json

    source = "--storage-options"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{source}: cannot be read ({exc})") from None
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{source}: not valid JSON") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{source}: expected a JSON object {{...}}")
    return value


def _one_line_warning(
    message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
) -> None:
    """Show a warning as one line of the command's output, not as Python's two."""
    print(f"slidescope batch: {category.__name__}: {message}", file=sys.stderr, flush=True)


class _Usage(Exception):
    """Bad usage found before any slide ran."""


def _batch(args: argparse.Namespace) -> int:
    from napari_slidescope.batch._flags import options_from_args, tiles_options_from_args
    from napari_slidescope.batch.engine import analyze_slides, check_extras
    from napari_slidescope.batch.params import (
        BatchParams,
        check_writable,
        find_slides,
        output_names,
    )

    try:
        tissue_options, nuclei_options = options_from_args(args)
        asked = tiles_options_from_args(args)
        tasks = tuple(args.tasks)
        tiles_options = None
        if args.tiles or "tiles" in tasks or asked.model:  # --embed implies --tiles
            from napari_slidescope.batch.engine import _tiles_options

            tiles_options = _tiles_options(asked)
            tasks = tuple(dict.fromkeys((*tasks, "tiles")))
        params = BatchParams(
            tasks,
            tissue_options,
            nuclei_options,
            storage_options=args.storage_options,
            tiles_options=tiles_options,
        )
        check_extras(anndata=args.anndata, spatialdata=args.spatialdata)
        if args.classify is not None:  # a bad rules file stops here, before any work
            from napari_slidescope.pipeline.cell_classes import load_classification

            load_classification(args.classify)
        if args.regions is not None:  # so does a file that is not a region classifier
            from napari_slidescope.batch.engine import _regions_options

            _regions_options(args.regions)
        if params.nuclei:
            from napari_slidescope.segmenters import missing_reason

            name = nuclei_options.segmenter
            reason = missing_reason(name)
            if reason is not None:
                raise _Usage(f"segmenter {name!r} is not available: {reason}")
        slides = find_slides(args.inputs, args.storage_options)
        if not slides:
            raise _Usage(f"no slides found in {' '.join(args.inputs)}")
        output_names(slides)
        check_writable(args.out)
    except KeyError as exc:
        raise _Usage(str(exc.args[0]) if exc.args else str(exc)) from None
    except (ValueError, OSError) as exc:
        raise _Usage(one_line(exc)) from None

    client = cluster = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout=20)
        except (OSError, TimeoutError) as exc:
            raise _Usage(
                f"cannot reach the scheduler at {args.scheduler}: {one_line(exc)}"
            ) from None
    elif args.dashboard:  # else analyze_slides starts (and closes) its own, without one
        from napari_slidescope.batch.engine import local_client

        client, cluster = local_client(
            args.workers or os.cpu_count() or 1,
            dashboard=True,
            resources={"GPU": 1} if args.gpu else None,
        )
    try:  # from here on the client and the cluster are closed whatever happens
        if args.dashboard and client is not None:
            print(f"dashboard: {client.dashboard_link}", file=sys.stderr, flush=True)
        view = _Progress(len(slides), enabled=not args.no_progress, out=args.out)
        view.verbose = args.verbose
        with view:
            rows = analyze_slides(
                slides,
                args.out,
                tasks=params.tasks,
                tissue_options=tissue_options,
                nuclei_options=nuclei_options,
                classify=args.classify,
                regions=args.regions,
                tiles_options=tiles_options,
                anndata=args.anndata,
                spatialdata=args.spatialdata,
                client=client,
                workers=args.workers,
                resume=args.resume,
                retries=max(0, args.retries),
                tiles_per_task=args.tiles_per_task,
                gpu=args.gpu,
                progress=view.update,
                storage_options=args.storage_options,
            )
    finally:
        if cluster is not None:  # ours: closed within a time limit
            from napari_slidescope.batch.engine import close_local

            close_local(client, cluster)
        elif client is not None:
            client.close()
    failed = [r for r in rows if r.get("status") != "done"]
    print(
        f"{len(rows)} slide(s): {len(rows) - len(failed)} done, {len(failed)} failed; "
        f"summary: {os.path.join(args.out, 'summary.csv')}"
    )
    return 1 if failed else 0


def _slide_line(row: dict[str, Any], *, kept: bool = False) -> str:
    """One line per finished slide: done, kept (finished earlier) or FAILED and why."""
    if row.get("status") != "done":
        return f"FAILED {row['slide']}: {row.get('error')}"
    parts = [f"kept   {row['slide']} (finished earlier)" if kept else f"done   {row['slide']}"]
    if row.get("tissue_area_mm2") is not None:
        parts.append(f"tissue {row['tissue_area_mm2']:.2f} mm²")
    if row.get("nuclei") is not None:
        parts.append(f"{row['nuclei']} nuclei")
    if row.get("tiles") is not None:
        parts.append(f"{row['tiles']} tiles")
    if row.get("seconds") is not None and not kept:
        parts.append(f"{row['seconds']:.1f} s")
    return ", ".join(parts)


def _traceback(out: str | os.PathLike[str], slide: str) -> str:
    """Return the traceback a failed slide's manifest keeps ("" when there is none)."""
    try:
        with open(os.path.join(out, slide, "manifest.json"), encoding="utf-8") as fh:
            return str(json.load(fh).get("traceback") or "")
    except (OSError, ValueError):
        return ""


class _Progress:
    """Slides and tiles bars (rich) and one line per finished slide."""

    def __init__(self, slides: int, *, enabled: bool, out: str = "") -> None:
        self.enabled = enabled
        self.out, self.verbose = out, False
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

    def update(self, state: BatchProgress) -> None:
        if state.finished is not None:
            line = _slide_line(state.finished, kept=state.kept)
            if self.verbose and state.finished.get("status") != "done":
                line += "\n" + _traceback(self.out, state.finished["slide"]).rstrip()
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
