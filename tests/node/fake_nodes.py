"""A fake Kubernetes API server on loopback holding Node objects: GET a node, PATCH its status
with a JSON patch (the two calls the adaptor's RBAC allows), 403 for anything else, and a
configurable failure status. Every request is recorded with its method, path and content type."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch

from tests.fake_apiserver import JsonHandler, LoopbackServer, write_kubeconfig


@dataclass
class Request:
    method: str
    path: str
    content_type: str
    authorization: str
    body: Any


class FakeNodes:
    def __init__(self, *names: str) -> None:
        self.nodes: dict[str, dict[str, Any]] = {
            name: {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
            }
            for name in names
        }
        self.requests: list[Request] = []
        self.fail_with: int | None = None
        self.lock = threading.Lock()
        self.patched = threading.Condition(self.lock)

        class Handler(_NodesHandler):
            fake = self

        self.server = LoopbackServer(Handler)

    @property
    def url(self) -> str:
        return self.server.url

    def capacity(self, node: str) -> dict[str, str]:
        with self.lock:
            return dict(self.nodes[node]["status"]["capacity"])

    def set_capacity(self, node: str, resource: str, value: str) -> None:
        """What a kubelet does to an extended resource it does not manage when it restarts."""
        with self.lock:
            self.nodes[node]["status"]["capacity"][resource] = value

    def wait_capacity(self, node: str, resource: str, value: str, timeout: float = 10) -> bool:
        with self.patched:
            return bool(
                self.patched.wait_for(
                    lambda: self.nodes[node]["status"]["capacity"].get(resource) == value, timeout
                )
            )

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    def kubeconfig(self, directory: Path) -> Path:
        return write_kubeconfig(directory, self.url, "node-token")


class _NodesHandler(JsonHandler):
    """Serves the nodes of `fake`, set by the subclass each FakeNodes makes."""

    fake: FakeNodes

    def _record(self, body: Any) -> None:
        self.fake.requests.append(
            Request(
                self.command,
                self.path.split("?", 1)[0],
                self.headers.get("Content-Type", ""),
                self.headers.get("Authorization", ""),
                body,
            )
        )

    def do_GET(self) -> None:
        self._record(None)
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        with self.fake.lock:
            if self.fake.fail_with is not None:
                return self._send(self.fake.fail_with, _status(self.fake.fail_with))
            if parts[:3] != ["api", "v1", "nodes"] or len(parts) != 4:
                return self._send(403, _status(403))
            node = self.fake.nodes.get(parts[3])
            if node is None:
                return self._send(404, _status(404))
            self._send(200, node)

    def do_PATCH(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        self._record(body)
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        with self.fake.lock:
            if self.fake.fail_with is not None:
                return self._send(self.fake.fail_with, _status(self.fake.fail_with))
            if parts[:3] != ["api", "v1", "nodes"] or parts[4:] != ["status"]:
                return self._send(403, _status(403))
            if self.headers.get("Content-Type") != "application/json-patch+json":
                return self._send(415, _status(415))
            node = self.fake.nodes.get(parts[3])
            if node is None:
                return self._send(404, _status(404))
            try:
                self.fake.nodes[parts[3]] = jsonpatch.apply_patch(node, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
                return self._send(422, _status(422))
            self.fake.patched.notify_all()
            self._send(200, self.fake.nodes[parts[3]])

    def do_PUT(self) -> None:
        self._record(None)
        self._send(403, _status(403))

    do_POST = do_DELETE = do_PUT


def _status(code: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}


@contextmanager
def fake_nodes(*names: str) -> Iterator[FakeNodes]:
    fake = FakeNodes(*names)
    fake.server.start()
    try:
        yield fake
    finally:
        fake.server.close()
