"""A fake Kubernetes API server on loopback: serves DRA objects by path, 404 for the rest, and a
configurable status for chosen paths (API errors)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

GROUP = "/apis/resource.k8s.io/v1"


def path_of(obj: dict[str, Any]) -> str:
    kind, meta = obj["kind"], obj["metadata"]
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates",
              "DeviceClass": "deviceclasses"}[kind]  # fmt: skip
    if kind == "DeviceClass":
        return f"{GROUP}/{plural}/{meta['name']}"
    return f"{GROUP}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, int] = {}
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests.append(self.path)
                path = self.path.split("?", 1)[0]
                if path in fake.failures:
                    self._send(fake.failures[path], {"kind": "Status", "message": "boom"})
                elif path in fake.objects:
                    self._send(200, fake.objects[path])
                else:
                    self._send(404, {"kind": "Status", "reason": "NotFound", "code": 404})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            self.objects[path_of(obj)] = obj

    def add_yaml(self, text: str) -> None:
        self.add(*(d for d in yaml.safe_load_all(text) if d))

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))  # fmt: skip
        return path

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
