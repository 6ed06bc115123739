"""Network policy shared by every remote read: timeouts, retries, backoff, what a failure means.

:mod:`.remote` (byte ranges of a file behind a URL) and :mod:`._dicomweb` (a DICOMweb
series) both read over a network and must behave alike: the same per-request timeout
(``$SLIDESCOPE_REMOTE_TIMEOUT``), the same number of retries of a transient failure
(``$SLIDESCOPE_REMOTE_RETRIES``) with the same exponential backoff, the same bound on
requests in flight, and the same words for what went wrong. Those live here, in a leaf
both import, so neither has to import the other.
"""

from __future__ import annotations

import os

#: Requests in flight at once for one file.
CONCURRENCY = 32

#: Environment variable: seconds one request may take before it counts as stalled.
TIMEOUT_ENV = "SLIDESCOPE_REMOTE_TIMEOUT"
#: Environment variable: retries of a transient failure.
RETRIES_ENV = "SLIDESCOPE_REMOTE_RETRIES"
DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
#: First backoff delay in seconds (doubled at each retry).
BACKOFF = 0.1


def default_timeout() -> float:
    """Seconds per request: ``$SLIDESCOPE_REMOTE_TIMEOUT`` or :data:`DEFAULT_TIMEOUT`."""
    return _env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def default_retries() -> int:
    """Retries of a transient failure: ``$SLIDESCOPE_REMOTE_RETRIES`` or the default 3."""
    return int(_env_number(RETRIES_ENV, DEFAULT_RETRIES))


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"${name}: expected a number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"${name}: expected a number >= 0, got {text!r}")
    return value


#: What a read says when the object is no longer the one opened.
CHANGED = (
    "changed on the server since it was opened (its ETag differs): open it again to read "
    "the new version"
)


class Failure(Exception):
    """A classified failure: what to say, and whether trying again may help."""

    def __init__(self, problem: str, transient: bool, *, stall: bool = False) -> None:
        super().__init__(problem)
        self.problem, self.transient, self.stall = problem, transient, stall


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 16:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


def _status(exc: BaseException) -> int | None:
    for attr in ("status", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)  # requests' HTTPError
    if isinstance(value, int) and 100 <= value < 600:
        return value
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata", {})
        value = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(value, int):
            return value
    return None


_STATUS_WORDS = {
    400: "bad request",
    401: "authentication required",
    403: "access denied",
    404: "not found",
    410: "gone",
    416: "range not satisfiable",
    429: "too many requests",
}


def classify(exc: BaseException, timeout: float) -> Failure:
    """Say what a failure of a read means and whether it is worth retrying.

    (``asyncio.TimeoutError`` is ``TimeoutError`` since Python 3.11.)
    """
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain}
    for e in chain:
        if isinstance(e, Failure):
            return e
    for e in chain:
        status = _status(e)
        if status == 412:  # If-Match failed: another object now lies under the name
            return Failure(CHANGED, False)
        if status is not None and status >= 400:
            word = _STATUS_WORDS.get(status, "server error" if status >= 500 else "refused")
            return Failure(f"HTTP {status} ({word})", status == 429 or status >= 500)
    if any(isinstance(e, TimeoutError) for e in chain) or names & {
        "FSTimeoutError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ServerTimeoutError",
    }:
        return Failure(f"no answer within the timeout ({timeout:g} s)", True, stall=True)
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or names & {
        "ClientConnectorError",
        "EndpointConnectionError",
        "ConnectionRefusedError",
    }:
        return Failure("connection refused (is the server up and the address right?)", True)
    if names & {
        "ClientPayloadError",
        "ServerDisconnectedError",
        "IncompleteRead",
        "ContentLengthError",
        "TransferEncodingError",
        "ResponseStreamingError",
    } or any(isinstance(e, ConnectionResetError | BrokenPipeError) for e in chain):
        return Failure("the server closed the connection mid-response", True)
    if any(isinstance(e, ConnectionError) for e in chain) or names & {"ClientOSError"}:
        return Failure(f"connection failed ({type(exc).__name__})", True)
    for e in chain:
        if isinstance(e, FileNotFoundError):
            return Failure("not found (404)", False)
        if isinstance(e, PermissionError):
            return Failure("access denied (403)", False)
    return Failure(f"cannot be read ({type(exc).__name__}: {exc})", False)
