"""DICOM WSI from a DICOMweb server (QIDO-RS search, WADO-RS metadata and frames).

A slide on a DICOMweb server is named by a URL whose scheme is the service's, prefixed
with ``dicomweb+``, and whose path is the service root followed by the study and series::

    dicomweb+https://host/dicomweb/studies/<StudyInstanceUID>/series/<SeriesInstanceUID>

Without ``/series/...`` the study's only slide series (Modality SM) is opened; a study
with several asks for one. wsidicom (``WsiDicom.open_web``) reads the series through
dicomweb-client: one QIDO-RS search for the series' instances, one WADO-RS metadata
request per instance, then frames; a read fetches all the tiles it misses from one
instance in one WADO-RS request (a multipart/related answer), and tiles are decoded here
as for a DICOM folder, so pixels equal the folder's.

Credentials, never printed: ``user:password@`` in the URL (basic auth), or in
``storage_options`` ``{"token": ...}`` (a bearer token), ``{"auth": (user, password)}``
or ``{"headers": {...}}``; else ``$SLIDESCOPE_DICOMWEB_TOKEN``, else what requests finds
itself (``~/.netrc``). Every request runs under the remote timeout
(``$SLIDESCOPE_REMOTE_TIMEOUT``) and transient failures are retried with backoff
(``$SLIDESCOPE_REMOTE_RETRIES``), as for every other URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from napari_slidescope.errors import SlideError
from napari_slidescope.slide._network import BACKOFF, CONCURRENCY
from napari_slidescope.slide.source import DICOMWEB_SCHEMES, Source

#: Environment variable: a bearer token for DICOMweb servers (when no option gives one).
TOKEN_ENV = "SLIDESCOPE_DICOMWEB_TOKEN"
#: The storage options a DICOMweb URL understands.
OPTIONS = ("token", "auth", "headers")

_PATH = re.compile(r"^(?P<root>.*?)/studies/(?P<study>[^/]+)(?:/series/(?P<series>[^/]+))?/?$")


@dataclass(frozen=True)
class DicomWebUrl:
    """The parts of a ``dicomweb+http(s)://`` URL.

    Attributes
    ----------
    root : str
        The service root as an ``http(s)://`` URL, without credentials or query.
    study, series : str
        Study and series instance UIDs (`series` None: the study's only slide series).
    username, password : str or None
        Basic-auth credentials given in the URL.
    """

    root: str
    study: str
    series: str | None
    username: str | None
    password: str | None


def is_dicomweb(source: Source) -> bool:
    """Tell whether `source` names a slide on a DICOMweb server."""
    return source.protocol in DICOMWEB_SCHEMES


def parse(source: Source) -> DicomWebUrl:
    """Split a ``dicomweb+http(s)://`` URL into the service root, study and series.

    Raises
    ------
    SlideError
        Naming the URL (without credentials) when its path has no ``/studies/<uid>``.
    """
    parts = urlsplit(source.target)
    m = _PATH.match(parts.path)
    if m is None or not parts.hostname:
        raise SlideError(
            source.display,
            "is not a DICOMweb slide URL: expected dicomweb+https://host/<service root>"
            "/studies/<StudyInstanceUID>/series/<SeriesInstanceUID>",
        )
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    scheme = parts.scheme.split("+", 1)[1].lower()
    root = urlunsplit((scheme, host, m.group("root"), "", ""))
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return DicomWebUrl(root, unquote(m.group("study")), _opt(m.group("series")), user, password)


def _opt(text: str | None) -> str | None:
    return unquote(text) if text else None


def session(source: Source, url: DicomWebUrl, *, timeout: float, retries: int) -> Any:
    """Return a requests session with the credentials, timeout and retries of `source`.

    Transient failures (refused or dropped connections, a stall past `timeout`, HTTP 429
    and 5xx) are retried `retries` times with exponential backoff; every request is a GET.

    Raises
    ------
    SlideError
        For a storage option a DICOMweb URL does not understand.
    """
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    unknown = sorted(set(source.storage_options) - set(OPTIONS))
    if unknown:
        raise SlideError(
            source.display,
            f"storage_options {unknown} do not apply to a DICOMweb URL (known: {list(OPTIONS)})",
        )

    class _Session(requests.Session):
        def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
            # ours, always: dicomweb-client sets none, wsidicom >= 0.36 its own 20 s
            kwargs["timeout"] = timeout
            return super().request(method, url, *args, **kwargs)

    s = _Session()
    retry = Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        backoff_factor=BACKOFF,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        raise_on_status=False,
        respect_retry_after_header=False,
    )
    adapter = HTTPAdapter(max_retries=retry, pool_maxsize=CONCURRENCY)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    options: Mapping[str, Any] = source.storage_options
    headers = options.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise SlideError(source.display, "storage_options['headers'] must be a mapping")
    s.headers.update({str(k): str(v) for k, v in headers.items()})
    token = options.get("token") or os.environ.get(TOKEN_ENV)
    auth = options.get("auth")
    if auth is None and url.username is not None:
        auth = (url.username, url.password or "")
    if auth is not None:
        if not (isinstance(auth, list | tuple) and len(auth) == 2):
            raise SlideError(source.display, "storage_options['auth'] must be (user, password)")
        s.auth = (str(auth[0]), str(auth[1]))
    elif token and "authorization" not in {k.lower() for k in s.headers}:
        s.headers["Authorization"] = f"Bearer {token}"
    return s


def secrets(source: Source) -> dict[str, Any]:
    """Every credential `source` carries (scrubbed from messages), the environment's too."""
    out: dict[str, Any] = dict(source.storage_options)
    token = os.environ.get(TOKEN_ENV)
    if token:
        out["env token"] = token
    url = parse(source) if _PATH.match(urlsplit(source.target).path) else None
    if url is not None and url.password:
        out["url password"] = url.password
    return out


def client(source: Source, url: DicomWebUrl, *, timeout: float, retries: int) -> Any:
    """Return a dicomweb-client ``DICOMwebClient`` on the service root of `url`."""
    from dicomweb_client.api import DICOMwebClient

    web = DICOMwebClient(url.root, session=session(source, url, timeout=timeout, retries=retries))
    web.set_http_retry_params(retry=False)  # the session's adapter retries
    return web


def series_of(web: Any, url: DicomWebUrl, display: str) -> str:
    """Return the series to open: the URL's, or the study's only slide (SM) series."""
    if url.series is not None:
        return url.series
    found = web.search_for_series(url.study, search_filters={"Modality": "SM"})
    uids = sorted({str(s["0020000E"]["Value"][0]) for s in found if "0020000E" in s})
    if not uids:
        raise SlideError(display, "holds no slide series (no series of Modality SM in the study)")
    if len(uids) > 1:
        raise SlideError(
            display,
            f"the study holds {len(uids)} slide series: name one with /series/<uid> "
            f"({', '.join(uids[:5])}{', ...' if len(uids) > 5 else ''})",
        )
    return uids[0]


def instance_uids(web: Any, url: DicomWebUrl, series: str) -> list[str]:
    """Return the series' SOP instance UIDs (one QIDO-RS request): what names its content."""
    found = web.search_for_instances(url.study, series)
    return sorted(str(i["00080018"]["Value"][0]) for i in found if "00080018" in i)


def stamp(source: Source, *, timeout: float, retries: int) -> dict[str, Any]:
    """Return what identifies a DICOMweb series' content, as ``stat_remote`` does for objects.

    DICOM instances never change under their SOP Instance UID, so the series' instance
    UIDs (one QIDO-RS request) name its content: their hash is the stamp's ``etag``.
    """
    import hashlib

    url = parse(source)
    web = client(source, url, timeout=timeout, retries=retries)
    try:
        series = series_of(web, url, source.display)
        uids = instance_uids(web, url, series)
    finally:
        web._session.close()
    if not uids:
        raise SlideError(source.display, "holds no DICOM instance of a slide in that series")
    digest = hashlib.sha256("\n".join(uids).encode()).hexdigest()[:32]
    return {"size": 0, "etag": digest, "version_id": None, "last_modified": None}
