"""Where a slide's bytes come from: a local path or an fsspec URL, and how to name it safely.

:func:`resolve` turns what the user gave (``"CMU-1.svs"``, ``Path(...)``,
``"https://host/slides/CMU-1.svs"``, ``"s3://bucket/CMU-1.svs"``, any other fsspec URL)
into a :class:`Source`. Every message, log line, layer name and manifest uses
:attr:`Source.display`, the URL without ``user:password@`` and without its query string
and fragment (where signed URLs and SAS tokens carry their secrets); only the filesystem
call sees :attr:`Source.target`. Credentials come the way each ecosystem expects: the
environment and config files the fsspec backend reads (``AWS_*``, ``~/.aws``, gcloud,
Azure), or ``storage_options``, which is passed to the backend and never printed.

Only this module and :mod:`napari_slidescope.slide.remote` import fsspec, lazily.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from napari_slidescope.errors import SlideError

__all__ = ["REMOTE_EXTRA", "Source", "UrlPath", "is_url", "redact", "resolve", "scrub"]

#: The optional dependency group that brings fsspec's network backends.
REMOTE_EXTRA = "remote"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
#: Backends by scheme, for the error naming what to install.
_BACKEND_PACKAGES = {
    "http": "aiohttp",
    "https": "aiohttp",
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}


def is_url(path_or_url: Any) -> bool:
    r"""Return True when `path_or_url` is a string of the form ``scheme://...``.

    ``file://`` URLs count as URLs too (:func:`resolve` turns them into local paths).
    A Windows path (``C:\slides``) or any :class:`os.PathLike` is never a URL.
    """
    return isinstance(path_or_url, str) and _SCHEME.match(path_or_url) is not None


def redact(url: str) -> str:
    """Return `url` without credentials: no ``user:password@``, no query, no fragment.

    Examples
    --------
    >>> redact("https://me:secret@host:8080/a/b.svs?X-Amz-Signature=abc#x")
    'https://host:8080/a/b.svs'
    >>> redact("/data/slide.svs")
    '/data/slide.svs'
    """
    if not is_url(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]*@")
_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s?#'\"]*)[?#][^\s'\"]*")


def scrub(text: str, secrets: Mapping[str, Any] | None = None) -> str:
    """Remove credentials from `text`: URL userinfo, query strings, and `secrets`' values.

    Used on exception messages of network libraries (which often quote the full URL)
    before they become part of a :class:`SlideError`.
    """
    text = _USERINFO.sub(r"\1", text)
    text = _QUERY.sub(r"\1", text)
    for value in _string_values(secrets or {}):
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _string_values(options: Any) -> list[str]:
    if isinstance(options, str):
        return [options]
    if isinstance(options, Mapping):
        return [v for item in options.values() for v in _string_values(item)]
    if isinstance(options, list | tuple):
        return [v for item in options for v in _string_values(item)]
    return []


class UrlPath:
    """The name of a remote slide, shaped like the parts of :class:`pathlib.Path` we use.

    ``str()`` is the redacted URL; :attr:`name`, :attr:`stem` and :attr:`suffix` are those
    of the URL's path. It is not a local path (no ``__fspath__``).
    """

    def __init__(self, display: str) -> None:
        self._display = display
        path = urlsplit(display).path.rstrip("/")
        self.name = path.rsplit("/", 1)[-1]
        dot = self.name.rfind(".")
        self.suffix = self.name[dot:] if dot > 0 else ""
        self.stem = self.name[:dot] if dot > 0 else self.name

    def __str__(self) -> str:
        return self._display

    def __repr__(self) -> str:
        return f"UrlPath({self._display!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UrlPath) and other._display == self._display

    def __hash__(self) -> int:
        return hash(self._display)

    def resolve(self) -> UrlPath:
        """Return itself (a URL is already absolute)."""
        return self


@dataclass(frozen=True)
class Source:
    """What to open and how to name it.

    Attributes
    ----------
    target : str
        A local path, or the URL exactly as given (it may carry credentials: never print it).
    protocol : str
        ``"file"`` for a local path, else the fsspec protocol (``"https"``, ``"s3"``...).
    storage_options : Mapping
        Keyword arguments for the fsspec filesystem (never printed).
    """

    target: str
    protocol: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_remote(self) -> bool:
        """True for everything that is not a local path."""
        return self.protocol != "file"

    @property
    def display(self) -> str:
        """The local path, or the URL without credentials: what messages show."""
        return redact(self.target) if self.is_remote else str(Path(self.target))

    @property
    def name(self) -> str:
        """The file name (last part of the path or URL path)."""
        return self.path.name

    @property
    def path(self) -> Path | UrlPath:
        """A :class:`~pathlib.Path` for a local file, a :class:`UrlPath` for a URL."""
        return UrlPath(self.display) if self.is_remote else Path(self.target)

    def scrub(self, text: str) -> str:
        """`text` with this source's credentials (and any URL's) removed."""
        text = text.replace(self.target, self.display) if self.is_remote else text
        return scrub(text, self.storage_options)

    def filesystem(self) -> tuple[Any, str]:
        """Return ``(fsspec filesystem, path inside it)``.

        Raises
        ------
        SlideError
            If the backend of the scheme is not installed (naming the extra to install)
            or refuses the storage options.
        """
        if self.protocol in DICOMWEB_SCHEMES:
            raise SlideError(
                self.display,
                "is a DICOMweb series, not a file or folder: open it with open_slide "
                "(the DICOM backend); it cannot be listed or read as bytes",
            )
        try:
            import fsspec
        except ImportError as exc:
            raise SlideError(
                self.display,
                f"reading {self.protocol}:// URLs needs fsspec: install "
                f"napari-slidescope[{REMOTE_EXTRA}]",
            ) from exc
        try:
            fs, path = fsspec.core.url_to_fs(self.target, **dict(self.storage_options))
        except ImportError as exc:
            package = _BACKEND_PACKAGES.get(self.protocol, "its fsspec backend")
            raise SlideError(
                self.display,
                f"reading {self.protocol}:// URLs needs {package}: install "
                f"napari-slidescope[{REMOTE_EXTRA}] ({self.scrub(str(exc))})",
            ) from exc
        except Exception as exc:
            raise SlideError(
                self.display,
                f"cannot set up the {self.protocol}:// filesystem "
                f"({type(exc).__name__}: {self.scrub(str(exc))})",
            ) from exc
        return fs, path


def resolve(
    path_or_url: str | os.PathLike[str] | Source,
    storage_options: Mapping[str, Any] | None = None,
) -> Source:
    """Turn a local path or an fsspec URL into a :class:`Source`.

    Parameters
    ----------
    path_or_url : str or PathLike or Source
        A local path, a ``file://`` URL (made a local path), or any URL whose scheme fsspec
        knows (``http(s)://``, ``s3://``, ``gs://``, ``az://``...).
    storage_options : Mapping, optional
        Passed to the fsspec filesystem (e.g. ``{"anon": True}`` for a public bucket,
        ``{"client_kwargs": {"endpoint_url": ...}}``). Refused with a local path.

    Returns
    -------
    Source

    Raises
    ------
    SlideError
        For a URL whose scheme no fsspec backend knows, naming the (redacted) URL and
        the scheme; for `storage_options` given with a local path.

    Examples
    --------
    >>> resolve("s3://bucket/a.svs").protocol
    's3'
    >>> resolve("https://u:p@host/a.svs?token=t").display
    'https://host/a.svs'
    >>> resolve("slides/a.svs").is_remote
    False
    """
    if isinstance(path_or_url, Source):
        if storage_options:
            return Source(path_or_url.target, path_or_url.protocol, dict(storage_options))
        return path_or_url
    if not is_url(path_or_url):
        target = os.fspath(path_or_url)
        if storage_options:
            raise SlideError(target, "storage_options apply to URLs only, not to a local path")
        return Source(target, "file")
    url = str(path_or_url)
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("file", "local"):
        local = urlsplit(url).path
        if storage_options:
            raise SlideError(local, "storage_options apply to URLs only, not to a local path")
        return Source(local, "file")
    if not _known_protocol(scheme):
        raise SlideError(
            redact(url),
            f"unknown URL scheme {scheme!r}: expected a local path, a URL that fsspec "
            "reads (http://, https://, s3://, gs://, az://, ...) or a DICOMweb series "
            "(dicomweb+https://...)",
        )
    return Source(url, scheme, dict(storage_options or {}))


#: DICOMweb services (``dicomweb+https://host/root/studies/<uid>/series/<uid>``): no fsspec.
DICOMWEB_SCHEMES = ("dicomweb+http", "dicomweb+https")


def _known_protocol(scheme: str) -> bool:
    if scheme in DICOMWEB_SCHEMES:
        return True
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:  # without fsspec: name the usual schemes, the extra is asked later
        return scheme in _BACKEND_PACKAGES
    return scheme in known_implementations or scheme in registry
