"""The services a run depends on, when they say no, as families: for the Ray address and for the MLflow tracking
server, an endpoint that refuses connections, one that accepts and never answers, one that answers in another
protocol, and a host name that does not resolve. Each must end in one line naming the address, what is wrong and
what to do, within a bound (the probe's timeout plus a margin: never Ray's or MLflow's minutes of retries), with
nothing written; a real gRPC server passes the Ray probe (Ray's own GCS: tests/pipeline/test_raytrain.py), a real MLflow server the
other (every tracked run on a server: the cluster tests).
"""
from __future__ import annotations

import http.server
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

import run_pipeline
from cluster import ClusterError, connect, probe
from pipeline.stage import StageError
from pipeline.tracking import store

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"
MARGIN_S = 3.0  # the bound on top of the probe's timeout (a loaded 2-core machine)


@contextmanager
def refusing() -> Iterator[int]:
    """A loopback port nothing listens on (bound, then released: connections are refused)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    yield port


@contextmanager
def silent() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them from the backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b"not here")

    def log_message(self, *args) -> None:
        pass


@contextmanager
def other_protocol() -> Iterator[int]:
    """An HTTP/1 server that answers 404 to everything (a web server, not Ray or MLflow)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


ENDPOINTS = {"refusing": (refusing, r"refuses connections \(nothing listens there\)"),
             "silent": (silent, r"does not answer within 1 s"),
             "other protocol": (other_protocol, None)}  # the problem differs by client: below
UNRESOLVABLE = "no-such-host.invalid"


@pytest.mark.parametrize("kind", list(ENDPOINTS))
def test_the_ray_probe_names_each_failing_endpoint_within_its_timeout(kind):
    endpoint, problem = ENDPOINTS[kind]
    with endpoint() as port:
        started = time.monotonic()
        said = probe.ray_gcs(f"127.0.0.1:{port}", timeout_s=1.0)
        took = time.monotonic() - started
        assert probe.ray_gcs(f"ray://127.0.0.1:{port}", timeout_s=1.0) == said  # Ray Client's address: the same
    assert re.fullmatch(problem or r"answers, but not as a Ray cluster does \(no gRPC server there\)", said or ""), said
    assert took <= 1.0 * 2 + MARGIN_S  # a connection, then an answer: each within the timeout
    assert probe.ray_gcs(f"{UNRESOLVABLE}:6379", timeout_s=1.0).startswith("does not resolve (")


def test_a_grpc_server_passes_the_ray_probe_and_auto_is_left_to_ray():
    """Ray's GCS is a gRPC server: a bare one (no services) answers the HTTP/2 preface as the GCS does."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert probe.ray_gcs(f"127.0.0.1:{port}") is None
        assert probe.ray_gcs(f"ray://127.0.0.1:{port}") is None
    finally:
        server.stop(None)
    assert probe.ray_gcs("auto") is None and probe.split_address("auto") is None  # Ray reads its own address file
    assert probe.split_address("[::1]:6379") == ("::1", 6379)


@pytest.mark.parametrize("kind", [*ENDPOINTS, "unresolvable"])
def test_connect_to_a_ray_address_that_fails_is_one_line_within_the_probe_s_bound(kind, monkeypatch, tmp_path):
    import ray

    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "none.json"))  # no cluster file: the generic hint
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail(f"ray.init reached: {kwargs}"))
    monkeypatch.setattr(probe, "PROBE_S", 1.0)
    monkeypatch.setattr(probe.ray_gcs, "__defaults__", (1.0,))
    endpoint = (lambda: _fixed(UNRESOLVABLE, 6379)) if kind == "unresolvable" else ENDPOINTS[kind][0]
    with endpoint() as port:
        host = UNRESOLVABLE if kind == "unresolvable" else "127.0.0.1"
        started = time.monotonic()
        with pytest.raises(ClusterError) as caught:
            connect.connect(f"{host}:{port}")
        took = time.monotonic() - started
    line = str(caught.value)
    assert "\n" not in line and took <= 2.0 + MARGIN_S
    assert re.fullmatch(rf"no Ray cluster answers at ray\.address={host}:{port}: it .+; start the cluster \(`ray up "
                        r"cluster\.yaml`, or `ray start --head` on that host\) or leave ray\.address empty to run on a "
                        r"local instance", line), line


@contextmanager
def _fixed(host: str, port: int) -> Iterator[int]:
    yield port


@pytest.mark.parametrize("kind", [*ENDPOINTS, "unresolvable"])
def test_the_mlflow_probe_names_each_failing_tracking_server_within_its_timeout(kind):
    endpoint = (lambda: _fixed(UNRESOLVABLE, 5000)) if kind == "unresolvable" else ENDPOINTS[kind][0]
    expected = {"refusing": ENDPOINTS["refusing"][1], "silent": ENDPOINTS["silent"][1],
                "other protocol": r"answers HTTP 404 at /health and 404 at its REST API, not as an MLflow tracking "
                                  r"server does",
                "unresolvable": r"does not resolve \(.+\)"}[kind]
    host = UNRESOLVABLE if kind == "unresolvable" else "127.0.0.1"
    with endpoint() as port:
        started = time.monotonic()
        said = probe.mlflow_server(f"http://{host}:{port}", timeout_s=1.0)
        took = time.monotonic() - started
    assert re.fullmatch(expected, said or ""), said
    assert took <= 2 * 1.0 + MARGIN_S
    # the URIs that are not a server are not probed: a local store, a file store
    assert probe.mlflow_server("sqlite:////nowhere/mlflow.db") is None and probe.mlflow_server("/nowhere/mlruns") is None


@pytest.mark.parametrize("kind", ["refusing", "silent"])
def test_a_tracked_run_against_a_failing_tracking_server_is_one_line_and_writes_nothing(kind, tmp_path, capsys,
                                                                                        monkeypatch):
    """Through run_pipeline.py as a user runs it: exit 2, the last line names the URI, the problem and what to do,
    within the probe's bound; the stage it would have run wrote nothing (the run's tracking opens first)."""
    monkeypatch.setattr(probe.mlflow_server, "__defaults__", (1.0,))
    workdir = tmp_path / "work"
    with ENDPOINTS[kind][0]() as port:
        uri = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        code = run_pipeline.main(["--config", str(SMOKE), f"workdir={workdir}", "tracking.enabled=true",
                                  f"tracking.uri={uri}", "--stages", "ingest"])
        took = time.monotonic() - started
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: tracking: the MLflow tracking server at {re.escape(uri)} {ENDPOINTS[kind][1]}; start "
                        r"it \(`mlflow server --host <host> --port <port>`, or `python -m cluster\.head start` on a "
                        r"cluster's head\) or point tracking\.uri \(else \$MLFLOW_TRACKING_URI\) at one that answers: "
                        r"empty is a sqlite store in the workdir; tracking\.enabled=false runs without MLflow", last), last
    assert took <= 2 * 1.0 + MARGIN_S + 10  # the config's load and the imports besides
    assert sorted(p.name for p in workdir.iterdir()) == []  # no stage started, nothing half-written


def test_open_client_refuses_before_mlflow_s_retries(monkeypatch):
    """MLflow's own client, given a refusing server, retries for minutes: open_client never gets there."""
    import mlflow.tracking

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda uri: pytest.fail("MlflowClient built"))
    monkeypatch.setattr(probe.mlflow_server, "__defaults__", (1.0,))
    with refusing() as port, pytest.raises(StageError, match=r"refuses connections"):
        store.open_client(f"http://127.0.0.1:{port}")
    assert os.environ.get("MLFLOW_TRACKING_URI") is None


def test_the_head_s_mlflow_port_taken_is_one_line_before_any_server_starts(tmp_path, monkeypatch, capsys):
    """`python -m cluster.head start --port P` with P held by another process: exit 2 and one line naming the
    address and what to do, before the server is launched (it used to die in its log, 17 s later, and the head
    said "mlflow server exited with code 0" in a traceback); a port that is free passes the same check."""
    from cluster import head

    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    monkeypatch.setattr(head, "start_mlflow", lambda *a, **k: pytest.fail("the server was launched"))
    with silent() as port:  # a listening socket: what another server holds
        code = head.main(["start", "--shared", str(tmp_path / "shared"), "--host", "127.0.0.1", "--advertise",
                          "127.0.0.1", "--port", str(port), "--ray-address", "127.0.0.1:1"])
        assert probe.port_taken("127.0.0.1", port) is not None
    assert code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"error: the MLflow server's address 127.0.0.1:{port} is in use by another process "
                    f"(`ss -ltnp 'sport = :{port}'` names it): stop that process, or give --port another port"), line
    assert not (tmp_path / "cluster.json").exists()
    with refusing() as port:
        assert probe.port_taken("127.0.0.1", port) is None


@pytest.mark.parametrize("kind, why", [("refusing", "refused the connection"),
                                       ("silent", "did not answer within MLFLOW_HTTP_REQUEST_TIMEOUT=1 s")])
def test_a_tracking_server_that_stops_answering_mid_run_is_given_up_within_seconds_and_named(kind, why, monkeypatch):
    """A server that died (refusing) or hangs (silent) after the run began: MLflow's own client, bounded by
    cluster.connect.TRACKING_ENV (the timeout cut to 1 s here), gives up within seconds, and its error — raised
    in the driver, or a worker's forwarded by Ray Train as text — becomes one TrackingLost line naming the
    server, why and what to do; any other error is not taken for it."""
    from mlflow.tracking import MlflowClient

    for key, value in connect.TRACKING_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with ENDPOINTS[kind][0]() as port:
        uri = f"http://127.0.0.1:{port}"
        began = time.monotonic()
        with pytest.raises(Exception) as raised:
            MlflowClient(uri).log_metric("0" * 32, "loss", 1.0)
        took = time.monotonic() - began
    assert took < (6.0 if kind == "refusing" else 3 * 1 + 6.0), took  # 2 retries 1 s and 2 s apart, jitter ≤ 1 s
    expected = (rf"^train: the MLflow tracking server at {re.escape(uri)} stopped answering \(it {re.escape(why)}\); "
                r"finished stages are kept and a training stage goes on from its last checkpoint: start the server "
                r"again and run the same command \(the runs left open are closed then\), or add tracking.enabled=false$")
    for error in (raised.value, f"rank 0: RuntimeError: MLflow logging failed: {raised.value}"):  # driver, worker
        lost = store.server_lost(error, "train")
        assert isinstance(lost, store.TrackingLost) and isinstance(lost, StageError)
        assert re.match(expected, str(lost)), str(lost)
    assert store.server_lost(RuntimeError("CUDA out of memory"), "train") is None
    assert store.server_lost(ValueError(f"API request to {uri}/api failed: 404 RESOURCE_DOES_NOT_EXIST"), "x") is None
