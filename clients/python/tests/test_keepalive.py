"""TCP keepalive on the client's connections, against a real kernel: a watch whose
path to the API server starts dropping packets ends within the keepalive bound, not at
its read timeout. Runs in a network namespace of its own (``unshare --net``, as root;
CI runs it), where an iptables rule drops the server's packets."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
import urllib3
from kubernetes import client as k8s

from leasehold_client import _kube

#: How long the stalled watch's read may wait before it times out on its own: far past
#: the keepalive bound, so only keepalive ends it in time.
READ_TIMEOUT = 60.0
#: The keepalive bound, and slack for a loaded machine.
BOUND = _kube.KEEPALIVE_IDLE + _kube.KEEPALIVE_INTERVAL * _kube.KEEPALIVE_COUNT
SLACK = 5.0


def test_the_clients_connections_have_keepalive_within_the_bound():
    configuration = k8s.Configuration(host="http://127.0.0.1:1")
    pool = _kube.api_client(configuration).rest_client.pool_manager
    options = pool.connection_pool_kw["socket_options"]
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in options, "urllib3's own default is kept"
    assert (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _kube.KEEPALIVE_IDLE) in options
    assert BOUND <= 10, "a dead watch is found about as soon as the Rust client's PINGs find it (6 s)"
    # A caller's own options stay, beside keepalive's.
    mine = (socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    configuration = k8s.Configuration(host="http://127.0.0.1:1")
    configuration.socket_options = [mine]
    options = _kube.api_client(configuration).rest_client.pool_manager.connection_pool_kw["socket_options"]
    assert mine in options and (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options


def _serve_a_silent_watch(listener: socket.socket) -> None:
    """Answer one request with the head of a chunked response, then stay silent."""
    conn, _ = listener.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    threading.Event().wait(READ_TIMEOUT + 10)  # keeps the socket open, sends nothing


def probe(keepalive: bool) -> float:
    """In this network namespace: seconds from the drop rule to the watch's end."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    threading.Thread(target=_serve_a_silent_watch, args=(listener,), daemon=True).start()
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    pool = _kube.api_client(configuration).rest_client.pool_manager
    if not keepalive:
        pool.connection_pool_kw["socket_options"] = list(urllib3.connection.HTTPConnection.default_socket_options)
    response = pool.request(
        "GET", f"http://127.0.0.1:{port}/watch", preload_content=False, timeout=urllib3.Timeout(connect=5, read=READ_TIMEOUT)
    )
    subprocess.run(["iptables", "-I", "INPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"], check=True)
    dropped = time.monotonic()
    try:
        for _ in response.stream(65536):
            pass
    except Exception:  # noqa: BLE001 - a connection the kernel dropped, or the read timeout
        pass
    return time.monotonic() - dropped


def _probe_in_a_namespace(keepalive: bool) -> float:
    out = subprocess.run(
        ["unshare", "--net", sys.executable, __file__, "keepalive" if keepalive else "plain"],
        check=True, capture_output=True, text=True, timeout=READ_TIMEOUT + 30,
    )
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a network namespace and an iptables rule in it")
def test_a_watch_on_a_path_that_drops_packets_ends_within_the_keepalive_bound():
    assert shutil.which("iptables") and shutil.which("unshare"), "iptables and unshare (util-linux) are needed"
    ended = _probe_in_a_namespace(keepalive=True)
    assert ended < BOUND + SLACK, f"the watch ended {ended:.1f} s after its packets were dropped (bound {BOUND} s)"


if __name__ == "__main__":
    print(probe(keepalive=sys.argv[1] == "keepalive"))
