"""Shared fixtures: a small catalog, trustme certificates, a live HTTPS webhook in a thread, and
`admit()` which round-trips a pod through it, applies the patch, validates the result against
the Kubernetes schema and checks that a second pass changes nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kubernetes_validate
import pytest
import trustme

from providers.core.catalog import Catalog, GpuSpec, InstanceType
from webhook import Admission, ServerConfig, Settings, VmChoices, WebhookServer
from webhook._resolver import Resolver

K8S_VERSION = "1.34"


def _t(
    name: str, vcpus: int, gib: int, gpu: GpuSpec | None = None, rdma: str = "", efa: int = 0
) -> InstanceType:
    return InstanceType(
        name=name,
        vcpus=vcpus,
        memory_mib=gib * 1024,
        gpu=gpu,
        rdma=rdma,  # type: ignore[arg-type]
        efa_interfaces=efa,
        price_per_hour=float(vcpus),
    )


def make_catalog() -> Catalog:
    return Catalog(
        cloud="aws",
        region="us-east-1",
        source="test",
        types=(
            _t("m5.xlarge", 4, 16),
            _t("m5.8xlarge", 32, 128),
            _t("g5.xlarge", 4, 16, GpuSpec(model="a10g", count=1, memory_mib=22888)),
            _t("g5.12xlarge", 48, 192, GpuSpec(model="a10g", count=4, memory_mib=22888)),
            _t("g6f.large", 2, 8, GpuSpec(model="l4", count=1, memory_mib=2861, fraction=0.125)),
            _t("g6f.2xlarge", 8, 32, GpuSpec(model="l4", count=1, memory_mib=11444, fraction=0.5)),
            _t("p4d.24xlarge", 96, 1152, GpuSpec(model="a100-40gb", count=8, memory_mib=40960),
               rdma="efa", efa=4),
            _t("p5.48xlarge", 192, 2048, GpuSpec(model="h100-80gb", count=8, memory_mib=81920),
               rdma="efa", efa=32),
        ),
    )  # fmt: skip


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return make_catalog()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(directory / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    return directory


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@dataclass
class Running:
    url: str
    server: WebhookServer
    client: httpx.Client


class ServerThread:
    """A WebhookServer on 127.0.0.1:0 in its own thread and event loop."""

    def __init__(self, admission: Admission, config: ServerConfig) -> None:
        self.server = WebhookServer(admission, config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="webhook-test", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.server.serve())
        except BaseException as exc:
            self.error = exc
        finally:
            self.loop.close()

    def __enter__(self) -> WebhookServer:
        self.thread.start()
        waited = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(self.server.started.wait(), 10), self.loop
        )
        waited.result(15)
        return self.server

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.stop)
        self.thread.join(20)
        assert not self.thread.is_alive(), "webhook server did not stop"


def serve(
    tls_dir: Path,
    ca: trustme.CA,
    settings: Settings,
    catalog: Catalog | None,
    resolver: Resolver | None = None,
    vm_choices: VmChoices | None = None,
    **config: Any,
) -> Iterator[Running]:
    admission = Admission(settings, lambda: catalog, resolver, vm_choices=vm_choices)
    cfg = ServerConfig(
        host="127.0.0.1",
        port=0,
        cert_file=tls_dir / "tls.crt",
        key_file=tls_dir / "tls.key",
        shutdown_seconds=2,
        **config,
    )
    with (
        ServerThread(admission, cfg) as server,
        httpx.Client(verify=client_context(ca), timeout=10) as client,
    ):
        yield Running(f"https://127.0.0.1:{server.port}", server, client)


@pytest.fixture(scope="session")
def webhook(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    settings = Settings(allowed_machine_types=frozenset({"g5.12xlarge", "p5.48xlarge"}))
    yield from serve(tls_dir, ca, settings, catalog)


def review(
    pod: dict[str, Any], namespace: str = "default", operation: str = "CREATE"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": pod,
            "dryRun": False,
        },
    }


def post(running: Running, body: dict[str, Any]) -> dict[str, Any]:
    reply = running.client.post(running.url + "/mutate", json=body)
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == body["request"]["uid"]
    return answer["response"]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


Admit = Callable[..., tuple[dict[str, Any], dict[str, Any]]]


def admit_via(
    running: Running, pod: dict[str, Any], namespace: str = "default"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(response, mutated pod) for an admitted pod; asserts schema validity and idempotence."""
    response = post(running, review(pod, namespace))
    assert response["allowed"] is True, response
    mutated = jsonpatch.apply_patch(pod, patch_of(response))
    kubernetes_validate.validate(mutated, K8S_VERSION, strict=True)
    again = post(running, review(mutated, namespace))
    assert again["allowed"] is True, again
    assert patch_of(again) == [], f"second pass changed the pod: {patch_of(again)}"
    return response, mutated


@pytest.fixture
def admit(webhook: Running) -> Admit:
    def run(
        pod: dict[str, Any], namespace: str = "default"
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return admit_via(webhook, pod, namespace)

    return run


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    runtime: str | None = "kata-remote",
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if runtime:
        body["runtimeClassName"] = runtime
    if init:
        body["initContainers"] = init
    meta: dict[str, Any] = {"name": "p", "namespace": "default"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def container(
    name: str,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    return c
