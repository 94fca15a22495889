"""How the daemon's parts meet: the device book observing CreateContainer outcomes, the proxy's
metrics, the catalog of a provider and the placement built whole over it. Kept apart from
`daemon.py` so each piece can be tested as a plain function."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from adaptor.devices import CdiConfig, DevicePlan, make_hook
from adaptor.devices.hook import OutcomeObserver
from adaptor.hypervisor.hooks import SandboxHook
from adaptor.planning.placement import (
    Placement,
    account_quota_cache,
    quota_pool,
    store_holdings,
)
from adaptor.podnet import Tunnel
from adaptor.proxy import Completion, CreateContainerHook
from adaptor.runtime import metrics
from adaptor.state import SandboxRecord, StateStore
from adaptor.status import DeviceBook, DeviceState
from adaptor.ttrpc import Code
from providers.core.base import Provider
from providers.core.catalog import CLOUDS, Catalog
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


class Sited(Protocol):
    """What names a provider's catalog: its cloud and region (a `Provider`, or a provider
    prepared but not yet built, `registry.Prepared`)."""

    @property
    def name(self) -> str: ...

    @property
    def region(self) -> str: ...


def catalog_for(provider: Sited, catalog_dir: str = "") -> Catalog | None:
    """The catalog selection runs over (none for static and local): the bundled snapshot of the
    provider's region (or the one under `catalog_dir`), or, for a region without one, the
    cloud's own listing. Blocking IO."""
    if provider.name not in CLOUDS:
        return None
    from providers.core.snapshots import load_catalog

    region = provider.region
    directory = Path(catalog_dir) if catalog_dir else None
    try:
        return load_catalog(provider.name, region, catalog_dir=directory)
    except CatalogError as missing:
        log.info("%s; reading the %s catalog of %s from its API", missing, provider.name, region)
        try:
            return load_catalog(provider.name, region, live=True)
        except CatalogError as exc:
            raise CatalogError(
                f"cannot select instance types for {provider.name} {region}: {missing}; "
                f"and the live listing failed: {exc}"
            ) from None


def build_placement(
    provider: Provider,
    catalog: Catalog | None,
    cdi: CdiConfig,
    *,
    gpu_quota: str = "",
    store: StateStore | None = None,
    account_quota_refresh_seconds: float = 0.0,
) -> Placement:
    """The placement `serve` plans with, whole: selection as the provider declares it (region,
    zones, allowed types, default type) over `catalog`, the `--gpu-quota` pool counting the
    store's sandboxes, and the cloud account's quotas read every `account_quota_refresh_seconds`
    (0: never)."""
    holdings = store_holdings(store) if store is not None else None
    return Placement.for_provider(
        provider,
        catalog,
        cdi.naming,
        quota=quota_pool(gpu_quota, catalog, holdings),
        account_quota=account_quota_cache(provider, catalog, account_quota_refresh_seconds),
    )


def placement_for(
    provider: Provider,
    cdi: CdiConfig,
    catalog_dir: str = "",
    *,
    gpu_quota: str = "",
    store: StateStore | None = None,
    account_quota_refresh_seconds: float = 0.0,
) -> Placement:
    """`build_placement` over the provider's catalog (`catalog_for`). Blocking IO."""
    return build_placement(
        provider,
        catalog_for(provider, catalog_dir),
        cdi,
        gpu_quota=gpu_quota,
        store=store,
        account_quota_refresh_seconds=account_quota_refresh_seconds,
    )


class ForgetDevices(SandboxHook):
    """Drops a stopped sandbox's containers from the device book."""

    def __init__(self, book: DeviceBook) -> None:
        self.book = book

    async def sandbox_gone(self, sandbox_id: str) -> None:
        self.book.forget(sandbox_id)
