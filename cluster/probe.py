"""Whether a service the run depends on answers, asked once with a short timeout before its own client is used.

Ray's client retries an address that refuses or never answers for minutes (`ray.address=127.0.0.1:1` was still
retrying after 5 minutes), and MLflow's HTTP client retries a refusing tracking server for ~4 minutes before a
30-line traceback. These probes answer within PROBE_S and say what is wrong in words:

- `ray_gcs(address)`: Ray's GCS is a gRPC server, and a gRPC server answers an HTTP/2 connection preface with a
  SETTINGS frame at once; so the probe sends the preface and waits for that frame.
- `mlflow_server(uri)`: an MLflow tracking server answers `GET <uri>/health` with 200 (unauthenticated, also
  behind MLflow's basic-auth app); a proxy that does not pass /health on is accepted when the REST API answers.
- `port_taken(host, port)`: whether a server of ours (the head's MLflow server) could bind the port, asked before
  it starts rather than learnt from its log after it died.

Each returns None when all is well, else the problem as a phrase ("refuses connections (nothing
listens there)"); the callers turn it into their one-line error.
"""
from __future__ import annotations

import errno
import socket
import urllib.error
import urllib.parse
import urllib.request

PROBE_S = 5.0  # what a probe waits for a connection, then for the answer
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, no flags, stream 0
SETTINGS = 4


def _connection_problem(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "refuses connections (nothing listens there)"
    if isinstance(error, socket.gaierror):
        return f"does not resolve ({error.strerror})"
    if isinstance(error, TimeoutError):  # socket.timeout is TimeoutError
        return f"does not answer within {timeout_s:g} s"
    if isinstance(error, OSError):
        return f"cannot be reached ({error.strerror or error})"
    return f"cannot be reached ({error})"


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address `host:port` or `ray://host:port`; None for "auto" or no port."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def ray_gcs(address: str, timeout_s: float = PROBE_S) -> str | None:
    """None when a gRPC server (Ray's GCS, or a Ray Client server for ray://) answers at `address`."""
    where = split_address(address)
    if where is None:
        return None  # "auto" and the like: Ray finds the address itself and says so when it cannot
    try:
        with socket.create_connection(where, timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(HTTP2_PREFACE + EMPTY_SETTINGS)
            header = b""
            while len(header) < 9:
                chunk = conn.recv(9 - len(header))
                if not chunk:
                    break
                header += chunk
    except (OSError, ValueError) as error:
        return _connection_problem(error, timeout_s)
    if len(header) < 9 or header[3] != SETTINGS:
        return "answers, but not as a Ray cluster does (no gRPC server there)"
    return None


def _http_status(url: str, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def mlflow_server(uri: str, timeout_s: float = PROBE_S) -> str | None:
    """None when an MLflow tracking server answers at the http(s) `uri` (other URIs are not probed)."""
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        return None
    base = uri.rstrip("/")
    try:
        status = _http_status(f"{base}/health", timeout_s)
        if status == 200:
            return None
        api = _http_status(f"{base}/api/2.0/mlflow/experiments/search?max_results=1", timeout_s)
    except urllib.error.URLError as error:
        reason = error.reason if isinstance(error.reason, BaseException) else OSError(str(error.reason))
        return _connection_problem(reason, timeout_s)
    except (OSError, ValueError) as error:
        return _connection_problem(error, timeout_s)
    if api in (200, 401, 403):  # it is MLflow's API (403/401: credentials, which MLflow's client sends)
        return None
    return f"answers HTTP {status} at /health and {api} at its REST API, not as an MLflow tracking server does"


def port_taken(host: str, port: int) -> str | None:
    """The problem when another process holds `host:port` (bound as servers bind: SO_REUSEADDR, so a port in
    TIME_WAIT is free), else None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return f"is in use by another process (`ss -ltnp 'sport = :{port}'` names it)"
    return None  # bound, or refused for another reason (an address not on this machine): the server says so
