"""How the daemon's parts meet: the device book observing CreateContainer outcomes, the proxy's
metrics, the catalog and placement of a provider. Kept apart from `daemon.py` so each piece can be
tested as a plain function."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from adaptor.devices import CdiConfig, DevicePlan, make_hook
from adaptor.devices.hook import OutcomeObserver
from adaptor.hypervisor.sandboxes import SandboxHook
from adaptor.planning import userdata
from adaptor.planning.placement import Placement, Plan
from adaptor.planning.userdata import GpuSetup, PodVMConfig
from adaptor.podnet import Tunnel, pod_network_section, write_apf_copy
from adaptor.podvm.layout import LayoutDocument
from adaptor.proxy import Completion, CreateContainerHook
from adaptor.proxy.pki import AdaptorPKI
from adaptor.runtime import metrics
from adaptor.state import SandboxRecord
from adaptor.status import DeviceBook, DeviceState
from adaptor.ttrpc import Code
from providers.core.base import Provider
from providers.core.catalog import CLOUDS
from providers.core.errors import CatalogError

log = logging.getLogger(__name__)


def observe_devices(book: DeviceBook, sandbox_id: str) -> OutcomeObserver:
    """Record each container's devices as pending, then ready or failed from the agent's answer."""

    def observe(container: str, devices: tuple[str, ...], refused: str) -> Completion | None:
        if refused:
            book.mark(sandbox_id, container or "(unknown)", DeviceState.FAILED, refused)
            return None
        book.set_devices(sandbox_id, container, devices)

        def done(code: int, message: str) -> None:
            if code == 0:
                book.mark(sandbox_id, container, DeviceState.READY)
            else:
                name = Code.from_wire(code).name
                book.mark(sandbox_id, container, DeviceState.FAILED, f"agent: {name}: {message}")

        return done

    return observe


def container_hooks(
    cdi: CdiConfig, book: DeviceBook
) -> Callable[[SandboxRecord], CreateContainerHook | None]:
    """Each sandbox's CreateContainer rewrite: its stored device plan, the CDI mode, the book.

    Installed for every sandbox, GPU or not, so a pod can never obtain devices by writing
    `cdi.k8s.io/*` annotations itself.
    """

    def hook_for(record: SandboxRecord) -> CreateContainerHook | None:
        plan = DevicePlan.from_json(record.device_plan) if record.device_plan else None
        return make_hook(plan, cdi.mode, cdi.registry, observe=observe_devices(book, record.id))

    return hook_for


def stored_json_checks() -> dict[str, Callable[[str], object]]:
    """The parsers the state store checks its JSON columns with: a row one rejects (a wrongly
    typed field of a tunnel or device plan) is quarantined like unreadable JSON, never served."""
    return {"device_plan": DevicePlan.from_json, "pod_network": Tunnel.from_json}


def count_capacity_fallback(provider: str, reason: str) -> None:
    """The providers' fallback observer: capacity fallbacks by provider and error code."""
    metrics.CAPACITY_FALLBACKS.labels(provider=provider, reason=reason).inc()


def count_proxy_call(service: str, method: str, code: int) -> None:
    """The proxy's per-call callback: calls by method and status code."""
    metrics.PROXY_CALLS.labels(method=f"{service}/{method}", code=str(code)).inc()


def placement_for(provider: Provider, cdi: CdiConfig, catalog_dir: str = "") -> Placement:
    """Selection as the provider declares it (region, zones, allowed types, default type) over
    its catalog (none for static and local): the bundled snapshot of its region, or, for a
    region without one, the cloud's own listing. Blocking IO."""
    if provider.name not in CLOUDS:
        return Placement.for_provider(provider, None, cdi.naming)
    from providers.core.snapshots import load_catalog

    region = provider.region
    directory = Path(catalog_dir) if catalog_dir else None
    try:
        catalog = load_catalog(provider.name, region, catalog_dir=directory)
    except CatalogError as missing:
        log.info("%s; reading the %s catalog of %s from its API", missing, provider.name, region)
        try:
            catalog = load_catalog(provider.name, region, live=True)
        except CatalogError as exc:
            raise CatalogError(
                f"cannot select instance types for {provider.name} {region}: {missing}; "
                f"and the live listing failed: {exc}"
            ) from None
    return Placement.for_provider(provider, catalog, cdi.naming)


def user_data_builder(
    cloud: str, pki: AdaptorPKI | None, pods_dir: Path | None = None
) -> Callable[[SandboxRecord, Plan], str]:
    """The pod VM's user data: apf.json with the pod network (CAA's `pod-network`), a server
    certificate from the adaptor's CA (when agent TLS is on) and the device layout for each GPU
    model the candidates may land on. With `pods_dir`, the operator's copy of the apf.json is
    kept at <pods-dir>/<id>/apf.json (mode 0600), as CAA keeps one."""

    def build(record: SandboxRecord, plan: Plan) -> str:
        pair = pki.issue_server(record.id) if pki is not None else None
        plans = plan.devices_by_model()
        setups = [GpuSetup.from_plan(devices) for devices in plans.values()]
        extra = tuple(
            (
                f"/run/peerpod/devices.{setup.model}.json",
                json.dumps(setup.to_json(), sort_keys=True),
            )
            for setup in setups[1:]
        )
        config = PodVMConfig(
            pod_namespace=record.pod_namespace,
            pod_name=record.pod_name,
            tls_server_cert=pair.cert_pem if pair else "",
            tls_server_key=pair.key_pem if pair else "",
            tls_client_ca=pki.ca_pem if pki is not None else "",
            pod_network=pod_network_section(record),
            gpu=setups[0] if setups else None,
            device_layouts=LayoutDocument.from_plans(plans.values()).to_dict() if plans else None,
            extra_files=extra,
        )
        built = userdata.build(cloud, config)
        if config.pod_network is None:
            log.info("sandbox %s: pod VM gets pod-network null", record.id)
        if pods_dir is not None:
            write_apf_copy(pods_dir, record.id, config.apf_json())
        return built

    return build


class ForgetDevices(SandboxHook):
    """Drops a stopped sandbox's containers from the device book."""

    def __init__(self, book: DeviceBook) -> None:
        self.book = book

    async def sandbox_gone(self, sandbox_id: str) -> None:
        self.book.forget(sandbox_id)
