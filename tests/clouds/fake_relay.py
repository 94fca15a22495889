"""The repository's cloud fakes (FakeGce, FakeArm) across a process boundary, on loopback.

`FakeServer` answers HTTP on 127.0.0.1 from a FakeCloud in the test's process; `Relay` is the
`requests` transport adapter a process mounts on its SDK's session (in place of the FakeCloud
itself) to send every request there, whatever host the SDK addressed. So a `peerpods serve` the
test kills with -9 talks to a cloud that outlives it, as the moto server does for EC2, and the
test reads and plays (the guests' power-offs) the same state the restarted serve finds.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter

from tests.fake_apiserver import LoopbackServer
from tests.providers.fakes.http import FakeCloud

HOP_BY_HOP = frozenset({"connection", "transfer-encoding", "content-length", "keep-alive"})


class FakeServer(LoopbackServer):
    """A FakeCloud served on a loopback port, one thread per request (as a cloud's API)."""

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud
        fake = cloud

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length", "0") or 0)
                body = self.rfile.read(size) if size else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                prepared = requests.Request(
                    self.command, f"https://fake{self.path}", headers=headers, data=body
                ).prepare()
                answer = fake.send(prepared)
                content = answer.content
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(Handler, server_class=_Server)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection the killed serve left is reset: not an error of the fake's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Relay(BaseAdapter):
    """Sends every request of the session it is mounted on to a FakeServer's port."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self._http = HTTPAdapter()

    def mount_on(self, session: requests.Session) -> None:
        session.mount("https://", self)
        session.mount("http://", self)

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        parts = urlsplit(request.url or "")
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        request.url = f"http://127.0.0.1:{self.port}{tail}"
        return self._http.send(request, **kwargs)

    def close(self) -> None:
        self._http.close()
