"""An in-memory Kubernetes object store behind a loopback HTTP server: GET (one, or a list with
`fieldSelector=spec.driver=` and `labelSelector=k=v`), POST, PUT (resourceVersion checked: 409
on a stale one, as the API server answers), DELETE. Enough of the API for the DRA publisher, its
lease and the kubelet plugin's claim reads; nothing it does not use."""

from __future__ import annotations

import copy
import itertools
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from providers.clouds.kube import KubeClient, kubeconfig_config
from tests.fake_apiserver import JsonHandler, LoopbackServer, write_kubeconfig


class Store:
    """Objects by collection path (e.g. /apis/resource.k8s.io/v1/resourceslices) and name."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.versions = itertools.count(1)
        self.writes: list[tuple[str, str]] = []  # (method, path) of every write

    def put(self, collection: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self.versions))
        meta.setdefault("uid", f"uid-{meta['resourceVersion']}")
        self.objects.setdefault(collection, {})[meta["name"]] = obj

    def items(self, collection: str) -> list[dict[str, Any]]:
        return list(self.objects.get(collection, {}).values())


_RESOURCES = frozenset({"resourceslices", "leases", "resourceclaims", "deviceclasses", "pods"})


def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    for selector in query.get("fieldSelector", []):
        key, _, value = selector.partition("=")
        if key == "spec.driver" and (obj.get("spec") or {}).get("driver") != value:
            return False
    for selector in query.get("labelSelector", []):
        key, _, value = selector.partition("=")
        if ((obj.get("metadata") or {}).get("labels") or {}).get(key) != value:
            return False
    return True


def _handler(store: Store) -> type[JsonHandler]:
    class Handler(JsonHandler):
        def _split(self) -> tuple[str, str, dict[str, list[str]]]:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            path = url.path.rstrip("/")
            if path.rpartition("/")[2] in _RESOURCES or self.command == "POST":
                return path, "", query
            collection, _, name = path.rpartition("/")
            return collection, name, query

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return dict(json.loads(self.rfile.read(length) or b"{}"))

        def _not_found(self) -> None:
            self._send(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})

        def do_GET(self) -> None:
            collection, name, query = self._split()
            with store.lock:
                if not name:
                    items = [o for o in store.items(collection) if _matches(o, query)]
                    self._send(200, {"kind": "List", "items": items})
                    return
                found = store.objects.get(collection, {}).get(name)
            if found is None:
                self._not_found()
            else:
                self._send(200, found)

        def do_POST(self) -> None:
            collection, _, _ = self._split()
            body = self._body()
            with store.lock:
                if body["metadata"]["name"] in store.objects.get(collection, {}):
                    self._send(409, {"kind": "Status", "reason": "AlreadyExists"})
                    return
                store.put(collection, body)
                store.writes.append(("POST", collection))
                self._send(201, store.objects[collection][body["metadata"]["name"]])

        def do_PUT(self) -> None:
            collection, name, _ = self._split()
            body = self._body()
            with store.lock:
                found = store.objects.get(collection, {}).get(name)
                if found is None:
                    self._not_found()
                    return
                if body["metadata"].get("resourceVersion") != found["metadata"]["resourceVersion"]:
                    self._send(409, {"kind": "Status", "reason": "Conflict"})
                    return
                store.put(collection, body)
                store.writes.append(("PUT", f"{collection}/{name}"))
                self._send(200, store.objects[collection][name])

        def do_DELETE(self) -> None:
            collection, name, _ = self._split()
            with store.lock:
                found = store.objects.get(collection, {}).pop(name, None)
                store.writes.append(("DELETE", f"{collection}/{name}"))
            if found is None:
                self._not_found()
            else:
                self._send(200, found)

    return Handler


class FakeKube:
    """The store, its server and a client of it (and the kubeconfig that reaches it)."""

    def __init__(self, directory: Path) -> None:
        self.store = Store()
        self.server = LoopbackServer(_handler(self.store))
        self.server.start()
        self.kubeconfig = write_kubeconfig(directory, self.server.url, "token")
        self.client = KubeClient(kubeconfig_config({"KUBECONFIG": str(self.kubeconfig)}))

    def close(self) -> None:
        self.client.close()
        self.server.close()
