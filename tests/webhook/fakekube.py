"""A fake Kubernetes API server on loopback: serves DRA objects by path, 404 for the rest, and a
configurable status for chosen paths (API errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.fake_apiserver import JsonHandler, LoopbackServer, write_kubeconfig

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

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                fake.requests.append(self.path)
                path = self.path.split("?", 1)[0]
                if path in fake.failures:
                    self._send(fake.failures[path], {"kind": "Status", "message": "boom"})
                elif path in fake.objects:
                    self._send(200, fake.objects[path])
                else:
                    self._send(404, {"kind": "Status", "reason": "NotFound", "code": 404})

        self.server = LoopbackServer(Handler)

    @property
    def url(self) -> str:
        return self.server.url

    def add(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            self.objects[path_of(obj)] = obj

    def add_yaml(self, text: str) -> None:
        self.add(*(d for d in yaml.safe_load_all(text) if d))

    def kubeconfig(self, directory: Path) -> Path:
        return write_kubeconfig(directory, self.url, "t")

    def __enter__(self) -> FakeKube:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
