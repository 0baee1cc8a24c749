"""The suite runs against a real toolpool stack: test/clients (go test ./test/clients -run TestPythonClient)
starts one and runs pytest with TOOLPOOL_URL, TOOLPOOL_TOKEN (a caller whose default workspace is
botspace) and TOOLPOOL_APPROVER_TOKEN; the policy asks for mkdir and denies sudo."""

import os
import socket
import threading
from urllib.parse import urlsplit

import pytest

from toolpool import Client


def _env(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"{name} is not set: run this suite with go test ./test/clients -run TestPythonClient, "
                    "which starts the stack and sets TOOLPOOL_URL, TOOLPOOL_TOKEN and TOOLPOOL_APPROVER_TOKEN")
    return v


@pytest.fixture(scope="session")
def url():
    return _env("TOOLPOOL_URL")


@pytest.fixture(scope="session")
def tp(url):
    return Client(url, _env("TOOLPOOL_TOKEN"))


@pytest.fixture(scope="session")
def approver(url):
    return Client(url, _env("TOOLPOOL_APPROVER_TOKEN"))


class DroppingProxy:
    """A TCP proxy to the dispatcher that drops connections: connection number i (from 0) is closed after
    cuts[i] bytes of the server's answer have been passed on (0: as soon as the server starts to answer),
    or, with stall, goes silent there and stays open (a peer gone without closing) until the proxy
    closes; connections past the list pass through whole."""

    def __init__(self, target, cuts, stall=False):
        self.stall = stall
        self.closed = threading.Event()
        parts = urlsplit(target)
        self.upstream = (parts.hostname, parts.port)
        self.cuts = list(cuts)
        self.connections = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                n = self.connections
                self.connections += 1
            limit = self.cuts[n] if n < len(self.cuts) else None
            threading.Thread(target=self._serve, args=(client, limit), daemon=True).start()

    def _serve(self, client, limit):
        upstream = socket.create_connection(self.upstream)

        def pump_up():
            try:
                while True:
                    b = client.recv(65536)
                    if not b:
                        break
                    upstream.sendall(b)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        sent = 0
        try:
            while True:
                b = upstream.recv(65536)
                if not b:
                    break
                if limit is not None and sent + len(b) > limit:
                    client.sendall(b[: limit - sent])
                    with self.lock:
                        self.dropped += 1
                    if self.stall:
                        self.closed.wait()
                    break
                client.sendall(b)
                sent += len(b)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.closed.set()
        self.sock.close()


@pytest.fixture
def proxy(url):
    made = []

    def make(*cuts, stall=False):
        p = DroppingProxy(url, cuts, stall)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
