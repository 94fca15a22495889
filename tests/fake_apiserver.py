"""What the fake Kubernetes API servers of the tests share: a loopback HTTP server, over TLS when
given a context, on a thread it owns; a handler that answers JSON and logs nothing; and the
kubeconfig that points a client at it. Each fake keeps only the API it pretends to serve."""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import yaml


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler whose answers are JSON bodies; quiet, so test output stays readable."""

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    """Serves `handler` on a free loopback port (TLS given a `context`) from start to close."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        context: ssl.SSLContext | None = None,
        server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
    ) -> None:
        self.httpd = server_class(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "http" if context is None else "https"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def write_kubeconfig(directory: Path, server: str, token: str) -> Path:
    """A kubeconfig in `directory` whose one context reaches `server` with a bearer token."""
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))  # fmt: skip
    return path
