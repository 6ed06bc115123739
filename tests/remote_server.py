"""A real HTTP server on 127.0.0.1 with byte ranges, delays and faults (tests, benchmarks).

``serve(folder)`` starts a threaded ``http.server`` in this process and returns a
:class:`RangeServer`: ``server.url("a.svs")`` is the file's URL, ``server.delay`` adds
seconds before each response (a network's round trip), ``server.fault`` makes every
response (or, with ``server.fault_after``, every response after that many) fail:

* ``"403"`` / ``"404"``: that status;
* ``"cut"``: the headers promise the whole body, half of it is sent, then the connection
  is closed;
* ``"stall"``: no answer at all until the server is stopped (or 60 s pass);
* ``"flaky"``: like ``"cut"`` for the next ``server.flaky`` responses only, then normal.

Every response carries an ``ETag`` (from the file's name, size and modification time); a
request whose ``If-Match`` names another is answered 412, unless ``server.ignore_if_match``
(a server that does not check it); ``server.weak_etags`` makes every ETag weak (``W/"..."``),
which no If-Match matches.

``server.log`` lists ``(method, path, range header)`` of every request.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Self

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes: without TCP_NODELAY (which real servers set)
    # Nagle's algorithm and the client's delayed ACK add 40 ms to every other response
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep quiet
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _fault(self) -> str | None:
        owner = self.server.owner
        with owner.lock:
            owner.log.append((self.command, self.path, self.headers.get("Range")))
            number = len(owner.log)
            if owner.fault == "flaky":
                if owner.flaky > 0:
                    owner.flaky -= 1
                    return "cut"
                return None
            if owner.fault is not None and number > owner.fault_after:
                return owner.fault
        return None

    def _serve(self, *, body: bool) -> None:
        owner = self.server.owner
        fault = self._fault()
        if owner.delay:
            time.sleep(owner.delay)
        if fault == "stall":
            owner.stop.wait(60)
            self.close_connection = True
            return
        if fault in ("403", "404"):
            self._status(int(fault))
            return
        rel = Path(self.path.split("?", 1)[0].lstrip("/"))
        path = owner.root / rel  # symlinks in the served folder are followed
        if ".." in rel.parts or not path.is_file():
            self._status(404)
            return
        st = path.stat()
        size = st.st_size
        tag = '"' + hashlib.sha256(f"{path.name}:{size}:{st.st_mtime_ns}".encode()).hexdigest()[:32]
        tag += '"'
        if owner.weak_etags:
            tag = "W/" + tag  # If-Match compares strongly: a weak ETag never matches
        match = self.headers.get("If-Match")
        if (
            match
            and not owner.ignore_if_match
            and (match.strip() != "*")
            and (tag.startswith("W/") or match.strip() != tag)
        ):
            self._status(412)  # the object is no longer the one the client asks for
            return
        start, end, status = 0, size, 200
        spec = self.headers.get("Range")
        if spec:
            m = _RANGE.match(spec.strip())
            if m is None:
                self._status(416)
                return
            a, b = m.groups()
            if a == "":  # suffix: the last b bytes
                start, end = max(0, size - int(b or 0)), size
            else:
                start, end = int(a), size if b == "" else min(int(b) + 1, size)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", tag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as fh:
            fh.seek(start)
            chunk = fh.read(end - start)
        if fault == "cut":
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(chunk)

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: Any


class LocalServer:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread, owning its handler's state.

    The handler reaches the server object as ``self.server.owner``. Subclasses set their
    state before calling ``super().__init__(handler)``; use as a context manager or call
    :meth:`close`.
    """

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._httpd.owner = self
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (stalled responses are released first)."""
        self.stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RangeServer(LocalServer):
    """A running server; use as a context manager or call :meth:`close`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.delay = 0.0
        self.fault: str | None = None
        self.fault_after = 0
        self.flaky = 0
        self.ignore_if_match = False
        self.weak_etags = False
        self.log: list[tuple[str, str, str | None]] = []
        super().__init__(_Handler)

    def url(self, name: str) -> str:
        """The URL of a file under the served folder."""
        return f"http://127.0.0.1:{self.port}/{name}"

    def reset(self) -> None:
        """No delay, no fault, empty log."""
        with self.lock:
            self.delay, self.fault, self.fault_after, self.flaky = 0.0, None, 0, 0
            self.ignore_if_match = self.weak_etags = False
            self.log.clear()


def serve(root: str | os.PathLike[str]) -> RangeServer:
    """Start serving `root` on 127.0.0.1 (a free port)."""
    return RangeServer(root)


def free_port() -> int:
    """A port nothing listens on (bound, then released): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Generous bound for a failure over the network (timeouts of about 1 s, a few retries):
#: the tests only check that nothing hangs, never how fast it fails.
BOUND_S = 30


def fails_within_bound(call: Any) -> BaseException | None:
    """Run `call` in a thread and return what it raised (None if nothing).

    The test fails at once if the call is still running after :data:`BOUND_S` (a hang guard).
    """
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), "the request hung"
    return box.get("exc")
