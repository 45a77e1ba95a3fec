"""Which failures of a network call are transient: the one classification every retry goes through.

Connection errors, timeouts and HTTP 408/425/429/5xx may pass by waiting; anything that describes the local
machine (a missing file, a full disk, a permission) or a client error (HTTP 4xx) fails the same way every
time. Used by the Prefect stages' retry policy (tasks.retry) and by the hub download's per-file retries
(data.fineweb), which runs on hosts without prefect.
"""

from __future__ import annotations

import errno
import importlib
import socket

from common.files import is_disk_full

# HTTP statuses worth retrying: timeouts, rate limits, server-side errors
TRANSIENT_HTTP_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# errnos of the network: an OSError with any other errno (read-only filesystem, name too long, permission
# denied, no such file, ...) describes the local machine and will not go away by waiting
NETWORK_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.EHOSTDOWN, errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.EPIPE, errno.EAGAIN,
    errno.EADDRNOTAVAIL, errno.ENOTCONN, errno.EPROTO,
})  # fmt: skip
# OSErrors that describe the local machine, not the network: they will not go away by waiting
_LOCAL_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)


def _http_client_network_errors() -> tuple[type[BaseException], ...]:
    """Network failures of the HTTP clients that are not OSErrors: httpx's (Prefect's client) and httpx2's
    (huggingface_hub's, so the hub lookups, downloads and `datasets` streaming). Protocol misuse is not among them."""
    found = []
    for module in ("httpx", "httpx2"):
        try:
            lib = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(lib, name) for name in ("NetworkError", "TimeoutException", "RemoteProtocolError")]
    return tuple(found)


_NETWORK_ERRORS = (ConnectionError, TimeoutError, *_http_client_network_errors())


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of urllib, requests/huggingface_hub and httpx errors, if the exception carries one."""
    for owner in (exc, getattr(exc, "response", None)):
        for attr in ("code", "status_code", "status"):
            value = getattr(owner, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
    return None


def is_transient_network_error(exc: BaseException) -> bool:
    """True for network trouble: connection errors, timeouts, a short read, HTTP 408/425/429/5xx."""
    status = http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP_STATUS
    if isinstance(exc, _LOCAL_OS_ERRORS) or is_disk_full(exc):  # a full disk does not empty itself
        return False
    if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, socket.gaierror):
        return exc.errno in NETWORK_ERRNOS
    # no errno: the HTTP clients' own errors (requests' are OSErrors without one), a name lookup that failed
    return isinstance(exc, (*_NETWORK_ERRORS, OSError))
