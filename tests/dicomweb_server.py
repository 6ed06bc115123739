"""A small DICOMweb server on 127.0.0.1 over folders of DICOM files (tests).

``serve(folders, token=None)`` starts a threaded ``http.server`` in this process and
returns a :class:`DicomWebServer`; ``server.url(study, series)`` is the slide's
``dicomweb+http://`` URL. Under ``/dicomweb`` it answers what wsidicom's client asks:

* QIDO-RS ``GET /studies/{study}/series`` and ``/studies/{study}/instances`` (filters
  ``SeriesInstanceUID``/``0020000E``, ``SOPClassUID``/``00080016``,
  ``Modality``/``00080060``), with each instance's ``AvailableTransferSyntaxUID`` (left
  out with ``server.list_syntaxes = False``: the client then probes);
  an unknown study is 404, no match is an empty list;
* WADO-RS ``GET .../instances/{uid}/metadata`` (the dataset without its pixel data, as
  DICOM JSON) and ``.../instances/{uid}/frames/{n,m,...}`` (the stored frames as
  ``multipart/related``; 406 when the Accept header asks for another transfer syntax).

``server.token`` set: every request without ``Authorization: Bearer <token>`` is 401.
``server.fault = "404"`` (any status): every response is that status; ``"stall"``: no
answer until the server is stopped. ``server.delay`` sleeps that many seconds before each
answer (a network's round trip). ``server.log`` lists the paths asked for and the
Authorization header each came with.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pydicom
from pydicom.encaps import generate_frames
from tests.remote_server import LocalServer, _Server

PREFIX = "/dicomweb"
_FILTERS = {
    "seriesinstanceuid": "0020000E",
    "sopclassuid": "00080016",
    "modality": "00080060",
    "studyinstanceuid": "0020000D",
}


class _Instance:
    def __init__(self, path: Path) -> None:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        self.path = path
        self.study = str(ds.StudyInstanceUID)
        self.series = str(ds.SeriesInstanceUID)
        self.uid = str(ds.SOPInstanceUID)
        self.sop_class = str(ds.SOPClassUID)
        self.modality = str(ds.get("Modality", ""))
        self.syntax = str(ds.file_meta.TransferSyntaxUID)
        meta = ds.to_json_dict(bulk_data_threshold=2**30)
        meta.pop("7FE00010", None)
        self.metadata = meta
        self._frames: list[bytes] | None = None
        self._lock = threading.Lock()

    def qido(self) -> dict[str, Any]:
        return {
            "0020000D": {"vr": "UI", "Value": [self.study]},
            "0020000E": {"vr": "UI", "Value": [self.series]},
            "00080018": {"vr": "UI", "Value": [self.uid]},
            "00080016": {"vr": "UI", "Value": [self.sop_class]},
            "00080060": {"vr": "CS", "Value": [self.modality]},
            "00083002": {"vr": "UI", "Value": [self.syntax]},
        }

    def frames(self) -> list[bytes]:
        with self._lock:
            if self._frames is None:
                ds = pydicom.dcmread(self.path)
                n = int(ds.get("NumberOfFrames", 1))
                if ds.file_meta.TransferSyntaxUID.is_compressed:
                    self._frames = list(generate_frames(ds.PixelData, number_of_frames=n))
                else:
                    data = bytes(ds.PixelData)
                    size = len(data) // n
                    self._frames = [data[i * size : (i + 1) * size] for i in range(n)]
            return self._frames


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        owner = self.server.owner
        auth = self.headers.get("Authorization")
        if owner.delay:
            time.sleep(owner.delay)  # a network's round trip
        with owner.lock:
            owner.log.append((self.path, auth))
            fault = owner.fault
        if fault == "stall":
            owner.stop.wait(60)
            self.close_connection = True
            return
        if fault is not None:
            self._send(int(fault), b"", "text/plain")
            return
        if owner.token is not None and auth != f"Bearer {owner.token}":
            self._send(401, b"", "text/plain")
            return
        parts = urlsplit(self.path)
        path = parts.path
        if not path.startswith(PREFIX + "/studies/"):
            self._send(404, b"", "text/plain")
            return
        segs = path[len(PREFIX) + 1 :].strip("/").split("/")
        study = segs[1]
        if not any(i.study == study for i in owner.instances.values()):
            self._send(404, b"", "text/plain")
            return
        query = parse_qs(parts.query)
        if len(segs) == 3 and segs[2] == "series":
            found = {i.series: i for i in self._match(study, query)}
            rows = [
                {k: v for k, v in i.qido().items() if k in ("0020000D", "0020000E", "00080060")}
                for i in found.values()
            ]
            self._json(rows)
        elif len(segs) == 3 and segs[2] == "instances":
            self._json([self._row(i) for i in self._match(study, query)])
        elif len(segs) == 5 and segs[2] == "series" and segs[4] == "instances":
            query.setdefault("0020000E", []).append(segs[3])
            self._json([self._row(i) for i in self._match(study, query)])
        elif len(segs) >= 7 and segs[2] == "series" and segs[4] == "instances":
            inst = owner.instances.get(segs[5])
            if inst is None or inst.series != segs[3] or inst.study != study:
                self._send(404, b"", "text/plain")
            elif len(segs) == 7 and segs[6] == "metadata":
                self._json([inst.metadata])
            elif len(segs) == 8 and segs[6] == "frames":
                self._frames(inst, segs[7])
            else:
                self._send(404, b"", "text/plain")
        else:
            self._send(404, b"", "text/plain")

    def _row(self, inst: _Instance) -> dict[str, Any]:
        row = inst.qido()
        if not self.server.owner.list_syntaxes:  # the client must probe with frame 1
            row.pop("00083002")
        return row

    def _match(self, study: str, query: dict[str, list[str]]) -> list[_Instance]:
        want: dict[str, set[str]] = {}
        for key, values in query.items():
            tag = _FILTERS.get(key.lower(), key.upper())
            if tag in _FILTERS.values():
                want.setdefault(tag, set()).update(values)
        out = []
        for inst in self.server.owner.instances.values():
            row = inst.qido()
            if inst.study == study and all(
                row[tag]["Value"][0] in values for tag, values in want.items()
            ):
                out.append(inst)
        return sorted(out, key=lambda i: i.uid)

    def _frames(self, inst: _Instance, spec: str) -> None:
        accept = self.headers.get("Accept", "")
        asked = re.findall(r"transfer-syntax=\"?([0-9.]+|\*)", accept)
        if asked and inst.syntax not in asked and "*" not in asked:
            self._send(406, b"", "text/plain")
            return
        frames = inst.frames()
        try:
            numbers = [int(n) for n in spec.split(",")]
        except ValueError:
            self._send(400, b"", "text/plain")
            return
        if any(n < 1 or n > len(frames) for n in numbers):
            self._send(404, b"", "text/plain")
            return
        kind = (
            "image/jpeg"
            if inst.syntax.startswith("1.2.840.10008.1.2.4.5")
            else ("application/octet-stream")
        )
        boundary = uuid.uuid4().hex
        body = bytearray()
        for n in numbers:
            body += (
                f"--{boundary}\r\nContent-Type: {kind}; transfer-syntax={inst.syntax}\r\n\r\n"
            ).encode()
            body += frames[n - 1]
            body += b"\r\n"
        body += f"--{boundary}--".encode()
        self._send(
            200,
            bytes(body),
            f'multipart/related; type="{kind}"; boundary={boundary}',
        )

    def _json(self, rows: list[dict[str, Any]]) -> None:
        self._send(200, json.dumps(rows).encode(), "application/dicom+json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class DicomWebServer(LocalServer):
    """A running DICOMweb server; use as a context manager or call :meth:`close`."""

    def __init__(self, folders: list[str | os.PathLike[str]], token: str | None = None) -> None:
        self.instances: dict[str, _Instance] = {}
        for folder in folders:
            for path in sorted(Path(folder).rglob("*.dcm")):
                inst = _Instance(path)
                self.instances[inst.uid] = inst
        self.token = token
        self.fault: str | None = None
        self.delay = 0.0
        self.list_syntaxes = True
        self.log: list[tuple[str, str | None]] = []
        super().__init__(_Handler)

    @property
    def root(self) -> str:
        """The service root, ``http://127.0.0.1:<port>/dicomweb``."""
        return f"http://127.0.0.1:{self.port}{PREFIX}"

    def series(self) -> dict[str, tuple[str, str]]:
        """``{folder name: (study uid, series uid)}`` of what is served."""
        return {i.path.parent.name: (i.study, i.series) for i in self.instances.values()}

    def url(self, study: str, series: str | None = None) -> str:
        """The ``dicomweb+http://`` URL of a series (or of a study)."""
        tail = f"/series/{series}" if series else ""
        return f"dicomweb+http://127.0.0.1:{self.port}{PREFIX}/studies/{study}{tail}"

    def reset(self) -> None:
        """No fault, no token, empty log."""
        with self.lock:
            self.fault, self.token, self.delay = None, None, 0.0
            self.list_syntaxes = True
            self.log.clear()


def serve(folders: list[str | os.PathLike[str]], token: str | None = None) -> DicomWebServer:
    """Serve the ``.dcm`` files under `folders` over DICOMweb on 127.0.0.1 (a free port)."""
    return DicomWebServer(folders, token)
