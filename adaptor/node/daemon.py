"""`peerpods serve`: wires the state store, the provider, the sandbox manager and the hypervisor
ttrpc server, and owns their lifetime.

Start: check the provider's settings and start it (nothing is written yet), lock the state
directory (one daemon per state), open the store, build the provider and every other part over
it, serve again the agent sockets of sandboxes that were running (each is abandoned if its shim does
not connect again within --reconnect-grace), then listen on --socket.
Shutdown (SIGTERM/SIGINT): close the agent sockets first and keep answering on --socket for at
most --shutdown-drain (a shim that loses its agent connection sends one StopVM), then give
in-flight calls a bounded grace and close every socket; VMs and records of sandboxes not stopped
stay, so the next start finds them. A second signal cuts the drain and the grace short.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import resource
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from adaptor.devices import CdiConfig, CdiNaming
from adaptor.hypervisor.gc import GarbageCollector
from adaptor.hypervisor.pod_network import PodNetworkHook
from adaptor.hypervisor.preemption import DroppedConnections, PreemptionWatcher
from adaptor.hypervisor.reaper import Reaper
from adaptor.hypervisor.sandboxes import (
    AgentProxyHandle,
    ManagerConfig,
    ProxyFactory,
    SandboxHook,
    SandboxManager,
    SandboxTable,
)
from adaptor.hypervisor.service import HypervisorService
from adaptor.node.advertise import CapacityAdvertiser, KubeNodeApi, NodeApi
from adaptor.node.catalogs import CatalogReloader, PlacementInUse
from adaptor.node.handoff import (
    STARTS_SECONDS,
    Detached,
    HandoffListener,
    Inherited,
    Session,
    check_listener,
    inherit,
)
from adaptor.node.handoff_wire import HandoffError
from adaptor.node.readiness import Readiness
from adaptor.node.settings import ServeSettings
from adaptor.node.warm import warm_pool_for
from adaptor.node.wiring import (
    ForgetDevices,
    build_placement,
    catalog_for,
    container_hooks,
    count_capacity_fallback,
    count_proxy_call,
    stored_json_checks,
)
from adaptor.planning.userdata import PodVmUserData
from adaptor.planning.vmpolicy import VmPolicy
from adaptor.podnet import PodNet, PodNetSettings, SandboxPodNetwork, is_local
from adaptor.proxy import AgentProxy, CreateContainerHook
from adaptor.proxy.moved import MovedProxy
from adaptor.proxy.pki import AdaptorPKI
from adaptor.state import SandboxRecord, StateStore
from adaptor.status import AbandonedBook, DeviceBook, build_app
from adaptor.status.app import refresh_sandbox_gauge
from adaptor.status.metrics_listener import MetricsListener
from adaptor.status.server import StatusServer
from adaptor.status.warmpool import add_warm_pool_route
from adaptor.ttrpc.server import Server
from adaptor.warmpool import WarmPool
from providers.clouds import registry
from providers.clouds.sdk import CloudCalls
from providers.clouds.settings import CloudSettings
from providers.core.base import Instance, Provider
from providers.core.catalog import CLOUDS, Catalog
from providers.core.contract import GPU_QUOTA_RESOURCE, MIG_QUOTA_RESOURCE
from providers.core.errors import PeerpodsError
from providers.core.markets import Inspectable

log = logging.getLogger(__name__)

LOCK_NAME = "serve.lock"


# A failed hand-off is taken back once the successor lets go of the state directory.
TAKE_BACK_SECONDS = 30.0


class TakeBackFailed(PeerpodsError):
    """A hand-off failed, and serving again afterwards failed too."""


class StateLocked(PeerpodsError):
    """Another `peerpods serve` already uses this state directory."""


def agent_tls_context(
    settings: ServeSettings,
) -> tuple[ssl.SSLContext | None, AdaptorPKI | None]:
    """The client TLS context for forwarder connections (None with --no-agent-tls), and the
    adaptor's CA when it is the one in use (no TLS files given). Blocking file IO."""
    tls = settings.agent_tls
    if not tls.enabled:
        return None, None
    from adaptor.proxy import client_tls_context

    pki: AdaptorPKI | None = None
    if tls.ca_file is None:
        pki = AdaptorPKI.load_or_create(settings.state_dir)
        files = (pki.ca_file, pki.client_cert_file, pki.client_key_file)
    else:
        assert tls.cert_file and tls.key_file  # checked by AgentTls
        files = (tls.ca_file, tls.cert_file, tls.key_file)
    try:
        return client_tls_context(*(str(f) for f in files)), pki
    except (OSError, ssl.SSLError) as exc:
        raise PeerpodsError(f"cannot load agent TLS files: {exc}") from exc


# A sandbox (with its VM) -> the CreateContainer rewrite for its proxy, or None to pass through.
ContainerHookFactory = Callable[[SandboxRecord], CreateContainerHook | None]
# A VM -> the (host, port) its forwarder is dialled at, instead of the VM's own address (tests).
EndpointResolver = Callable[[Instance], tuple[str, int]]


def agent_proxy_factory(
    tls: ssl.SSLContext | None,
    container_hooks: ContainerHookFactory | None = None,
    resolve_endpoint: EndpointResolver | None = None,
    on_upstream_lost: Callable[[str], None] | None = None,
    check_sandbox: bool = False,
) -> ProxyFactory:
    """Builds each sandbox's AgentProxy dialing its forwarder (over mTLS when `tls` is set;
    with `check_sandbox`, the forwarder's certificate must name the sandbox, as the adaptor's
    own CA issues them); `resolve_endpoint` overrides where a VM's forwarder is dialled (tests),
    and `on_upstream_lost(sandbox id)` hears of each dropped connection."""

    def make(record: SandboxRecord, socket_path: str, host: str, port: int) -> AgentProxyHandle:
        from adaptor.proxy import AgentProxy, tcp_dialer

        if resolve_endpoint is not None and record.instance is not None:
            host, port = resolve_endpoint(record.instance)

        proxy: AgentProxyHandle = AgentProxy(
            socket_path,
            tcp_dialer(host, port, ssl=tls, sandbox_id=record.id if check_sandbox else None),
            sandbox_id=record.id,
            create_container_hook=container_hooks(record) if container_hooks else None,
            on_call=count_proxy_call,
            on_upstream_lost=(
                (lambda: on_upstream_lost(record.id)) if on_upstream_lost is not None else None
            ),
        )
        return proxy

    return make


class Daemon:
    """The node daemon's parts, started and closed together."""

    def __init__(
        self,
        settings: ServeSettings,
        *,
        provider: Provider | None = None,
        proxy_factory: ProxyFactory | None = None,
        resolve_endpoint: EndpointResolver | None = None,
        container_hooks: ContainerHookFactory | None = None,
        provider_settings: CloudSettings | None = None,
        cdi: CdiConfig | None = None,
        catalog: Catalog | None = None,
        hooks: Sequence[SandboxHook] = (),
        node_api: NodeApi | None = None,
    ) -> None:
        self.settings = settings
        self._provider = provider
        self._proxy_factory = proxy_factory
        self._resolve_endpoint = resolve_endpoint
        self._container_hooks = container_hooks
        self._provider_settings = provider_settings
        self._cdi = cdi or CdiConfig("annotations", CdiNaming(), None)
        # the catalog to select from instead of the provider's own (tests)
        self._catalog = catalog
        self._hooks = tuple(hooks)
        self.devices = DeviceBook()
        self.abandoned = AbandonedBook()
        self.status: StatusServer | None = None
        self.metrics: MetricsListener | None = None
        # the cloud provider's SDK pool and background deletes (built with the provider)
        self._calls: CloudCalls | None = None
        self._lock_fd: int | None = None
        self.store: StateStore | None = None
        self.manager: SandboxManager | None = None
        self.server: Server | None = None
        self.gc: GarbageCollector | None = None
        self.reaper: Reaper | None = None
        self.podnet: PodNet | None = None
        self.watcher: PreemptionWatcher | None = None
        self._node_api = node_api
        self.advertiser: CapacityAdvertiser | None = None
        self.readiness: Readiness | None = None
        self.catalogs: CatalogReloader | None = None
        self.warm: WarmPool | None = None  # the warm pools (--warm-pool), None without
        # The hand-off (adaptor.node.handoff): a successor's listener, a predecessor's sockets.
        self._handoff: HandoffListener | None = None
        self._taking: Session | None = None
        self._inherited: Inherited | None = None
        self._handing_off = False
        self._moving: dict[str, AgentProxy] = {}
        self.ended = asyncio.Event()  # set once a successor serves everything
        self.failed = False  # a failed hand-off could not be taken back: the daemon stopped

    async def start(self) -> None:
        """Bring everything up; on failure, whatever started is closed again."""
        try:
            await self._start()
        except BaseException:
            await self.close(grace_seconds=0)
            raise

    async def _start(self) -> None:
        """The parts in their order: the provider's settings checked and its catalog read, the
        store (after a take-over's hand-shake), then, each from finished parts, the provider,
        placement, agent proxies, pod networking, the sandbox manager and its recovery, the
        background loops, the status API, the hypervisor socket, then the node's capacity."""
        settings = self.settings
        # Checked first: a bad provider setting fails before anything is written.
        prepared, catalog = await self._prepare_provider()
        # So are the operator's agent TLS files: on a take-over they must load before the
        # predecessor lets go of its store and sockets (the own CA lives in the state
        # directory, read once it is ours).
        early = (
            await asyncio.to_thread(agent_tls_context, settings) if _tls_at_hand(settings) else None
        )
        store = await self._open_store()
        provider = prepared.finish(store)  # a static pool's leases live in the store
        placement = PlacementInUse(
            build_placement(
                provider,
                catalog,
                self._cdi,
                gpu_quota=settings.gpu_quota,
                store=store,
                account_quota_refresh_seconds=settings.account_quota_refresh_seconds,
            )
        )
        self.warm = warm_pool_for(settings, provider, store, placement)
        tls, pki = (
            early if early is not None else await asyncio.to_thread(agent_tls_context, settings)
        )
        # dropped agent connections, checked by the preemption watcher (a provider that inspects)
        dropped = DroppedConnections() if isinstance(provider, Inspectable) else None
        proxy_factory = self._proxy_factory or agent_proxy_factory(
            tls,
            self._container_hooks or container_hooks(self._cdi, self.devices),
            self._resolve_endpoint,
            on_upstream_lost=dropped.tell if dropped is not None else None,
            # the adaptor's CA issues each cloud VM its own certificate (in its user data);
            # pre-provisioned pools (static) keep the certificate they were given once
            check_sandbox=pki is not None and provider.name in CLOUDS,
        )
        if self._taking is not None:  # a take-over dials the pod VMs before the sockets move
            proxy_factory = self._taking.predialing(proxy_factory)
        podnet = await self._start_pod_network(store)
        self.manager = self._sandbox_manager(provider, placement, store, proxy_factory, pki, podnet)
        self.manager.table.warm = self.warm
        await self._recover(self.manager)
        self._start_loops(self.manager, provider, placement, store, dropped)
        await self._start_status(placement, store)
        await self._start_metrics(store)
        await self._serve_hypervisor(self.manager)
        self._advertise()
        log.info(
            "serving hypervisor.Hypervisor on %s (provider %s)", settings.socket, provider.name
        )

    def _sandbox_manager(
        self,
        provider: Provider,
        placement: PlacementInUse,
        store: StateStore,
        proxy_factory: ProxyFactory,
        pki: AdaptorPKI | None,
        podnet: PodNet,
    ) -> SandboxManager:
        """The sandbox lifecycle over its fully built parts: placement, user data, hooks."""
        settings = self.settings
        # the pod VM's user data (static and local VMs are configured by whoever made them)
        user_data = PodVmUserData(provider.name, pki, settings.pods_dir)
        table = SandboxTable(
            ManagerConfig.of(settings),
            store,
            provider,
            placement,
            proxy_factory,
            # the pod's tunnel first: the other hooks see the record it leaves
            hooks=(
                PodNetworkHook(SandboxPodNetwork(podnet, settings.pods_dir)),
                *self._hooks,
                ForgetDevices(self.devices),
            ),
            vm_policy=VmPolicy(
                frozenset(settings.allowed_machine_types), frozenset(settings.allowed_images)
            ).check,
            user_data=user_data.build if provider.name in CLOUDS else None,
            on_abandoned=self.abandoned.add,
        )
        return SandboxManager(table)

    async def _prepare_provider(self) -> tuple[registry.Prepared, Catalog | None]:
        """The provider, checked and started but not yet built over the store (in a thread: a
        cloud provider may ask the node's instance metadata service), and the catalog its
        placement selects from. Writes nothing."""
        settings = self.settings
        if self._provider is not None:
            prepared = registry.Prepared.built(self._provider)
        else:
            self._calls = CloudCalls(on_fallback=count_capacity_fallback)
            prepared = await asyncio.to_thread(
                registry.prepare,
                settings.provider,
                registry.ProviderOptions(
                    static_endpoints=settings.static_endpoints,
                    settings=self._provider_settings,
                    owner_id=settings.owner_id or f"peerpods-{socket.gethostname()}",
                    calls=self._calls,
                ),
            )
        if self._catalog is not None:
            return prepared, self._catalog
        catalog = await asyncio.to_thread(catalog_for, prepared, settings.catalog_dir)
        return prepared, catalog

    async def _open_store(self) -> StateStore:
        """The state store, once a predecessor (on a take-over) has let go of it and no live
        daemon serves the socket."""
        settings = self.settings
        lock_file = settings.state_dir / LOCK_NAME
        if self._lock_fd is None:  # held already when taking back a failed hand-off
            take_over = {"always": True, "never": False}.get(settings.take_over)
            self._taking = await inherit(take_over, settings.pods_dir, lock_file)
            self._lock_fd = await asyncio.to_thread(_lock_state_dir, str(settings.state_dir))
            if self._taking is None:
                await asyncio.to_thread(_refuse_live_socket, str(settings.socket))
        self.store = await StateStore.open(settings.state_dir, checks=stored_json_checks())
        return self.store

    async def _start_pod_network(self, store: StateStore) -> PodNet:
        """Pod networking, its leases checked against the records and its sweep running."""
        self.podnet = podnet = PodNet(PodNetSettings.of(self.settings), store)

        async def recorded() -> list[str]:
            # a quarantined record still names its sandbox: its VNI lease is not stale
            return [r.id for r in await store.records()] + list(await store.quarantined())

        await podnet.scan(recorded)
        podnet.start_sweeping()
        await self._warn_local_endpoints()
        return podnet

    async def _warn_local_endpoints(self) -> None:
        """Static endpoints on this node's own addresses serve host-network pods only: a pod
        with a network is refused a tunnel to them at StartVM (it would loop back into it)."""
        settings = self.settings
        if settings.provider != "static":
            return
        local = [
            str(endpoint)
            for endpoint in settings.static_endpoints
            if await asyncio.to_thread(is_local, None, endpoint.host)
        ]
        if local:
            log.warning(
                "static endpoints %s are addresses of this node: a pod with a network is "
                "refused a tunnel to them at StartVM (its frames would loop back into it); "
                "only host-network pods can use them",
                ", ".join(local),
            )

    async def _recover(self, manager: SandboxManager) -> None:
        """The recorded sandboxes, served again (through a predecessor's sockets when taking
        over: our parts are up, so now the shims wait only for the sockets)."""
        if self._taking is not None:
            records = await manager.store.records()
            self._inherited = await self._taking.receive(records, manager.default_endpoint)
            self._taking = None
        await manager.recover(self._inherited.adopt if self._inherited is not None else None)
        if self._inherited is not None and (unclaimed := await self._inherited.close_unclaimed()):
            log.warning("hand-off: sandboxes not running here any more: %s", ", ".join(unclaimed))

    def _start_loops(
        self,
        manager: SandboxManager,
        provider: Provider,
        placement: PlacementInUse,
        store: StateStore,
        dropped: DroppedConnections | None,
    ) -> None:
        """The owned background loops: preemption watch, VM collector, reaper, catalog reload,
        readiness."""
        settings = self.settings
        if isinstance(provider, Inspectable):
            self.watcher = PreemptionWatcher(
                manager, provider, settings.preemption_check_interval_seconds, dropped=dropped
            )
            self.watcher.start()
        owner_id = getattr(provider, "owner_id", None)
        if settings.gc_interval_seconds > 0 and isinstance(owner_id, str) and owner_id:
            # Only a provider whose owner tag is this node's own may be swept: another node's
            # sandboxes are unknown here, and their VMs must never look like orphans.

            async def known() -> list[str]:
                # a quarantined record still names its sandbox: its VM is not an orphan
                ids = [r.id for r in await store.records()]
                return ids + list(await store.quarantined())

            self.gc = GarbageCollector(
                provider, owner_id, known, interval_seconds=settings.gc_interval_seconds
            )
            self.gc.start()
        if settings.reap_grace_seconds > 0:
            self.reaper = Reaper(manager, grace_seconds=settings.reap_grace_seconds)
            self.reaper.start()
        catalog = placement.current.catalog
        if settings.catalog_dir and provider.name in CLOUDS and catalog is not None:
            # a catalog rewritten under --catalog-dir is used without a restart
            self.catalogs = CatalogReloader(
                placement, provider.name, catalog.region, Path(settings.catalog_dir)
            )
            self.catalogs.start()
        self.readiness = Readiness(
            provider,
            lambda: self.server is not None,
            notes=[self.catalogs.status] if self.catalogs is not None else [],
        )
        self.readiness.start()
        if self.warm is not None:
            self.warm.start()

    async def _start_metrics(self, store: StateStore) -> None:
        """The metrics-only listener (adaptor.status.metrics_listener), when an address is set."""
        settings = self.settings
        if not settings.metrics_address:
            return
        self.metrics = MetricsListener(
            settings.metrics_address,
            refresh=lambda: refresh_sandbox_gauge(store),
            host_names=(settings.node_name, socket.gethostname()),
        )
        await self.metrics.start()

    async def _start_status(self, placement: PlacementInUse, store: StateStore) -> None:
        """The status API, when an address is set."""
        settings = self.settings
        if not settings.status_address or self.readiness is None:
            return
        app = build_app(
            store,
            self.devices,
            readiness=self.readiness.check,
            refresh_metrics=lambda: refresh_sandbox_gauge(store),
            abandoned=self.abandoned,
            # the names a request's Host may carry besides IP addresses and localhost
            host_names=(settings.node_name, socket.gethostname()),
            account_quota=lambda: (
                quota.value if (quota := placement.current.account_quota) else None
            ),
        )
        add_warm_pool_route(app, self.warm.snapshot if self.warm is not None else None)
        self.status = StatusServer(app, settings.status_address)
        inherited = self._inherited.take_status() if self._inherited is not None else None
        await self.status.start(inherited)
        if self.status.listening:
            log.info("status API on %s", self.status.url)

    async def _serve_hypervisor(self, manager: SandboxManager) -> None:
        """The hypervisor socket (a predecessor's, when taking over) and the hand-off listener
        a successor will call."""
        settings = self.settings
        server = Server()
        HypervisorService(manager).register(server)
        hypervisor = self._inherited.hypervisor if self._inherited is not None else None
        if hypervisor is not None:
            try:
                await asyncio.to_thread(check_listener, hypervisor, str(settings.socket))
            except HandoffError as exc:
                log.error(
                    "hand-off: refusing the hypervisor socket handed over (%s); binding %s anew",
                    exc,
                    settings.socket,
                )
                hypervisor.close()
                hypervisor = None
        if hypervisor is not None:
            await server.adopt_unix(hypervisor, str(settings.socket))
        else:
            await server.start_unix(str(settings.socket), mode=0o600)
        self.server = server
        self._handoff = HandoffListener(settings.pods_dir, self)
        await self._handoff.start()
        if self._inherited is not None:
            await self._inherited.ack(True)
            self._inherited = None

    def _advertise(self) -> None:
        """The node's capacity, advertised only once the socket serves: the scheduler sends
        pods from then on."""
        settings = self.settings
        if not settings.node_name:
            return
        self.advertiser = CapacityAdvertiser(
            self._node_api or KubeNodeApi(),
            settings.node_name,
            settings.vm_capacity,
            # the resources peer pods keep for namespace quotas, never the scarce ones here
            extra={
                GPU_QUOTA_RESOURCE: settings.quota_capacity,
                MIG_QUOTA_RESOURCE: settings.quota_capacity,
            },
            interval_seconds=settings.capacity_check_interval_seconds,
            retry_seconds=min(5.0, settings.capacity_check_interval_seconds),
            # 0 peer pods while /readyz fails: the scheduler sends none that could only fail
            ready=self.readiness.ready if self.readiness is not None else None,
            ready_poll_seconds=min(1.0, settings.capacity_check_interval_seconds),
        )
        self.advertiser.start()

    async def close(self, grace_seconds: float | None = None) -> None:
        """See `_close`; during a hand-off, until the successor serves everything instead."""
        if self._handing_off:
            await self.ended.wait()
            return
        if self._taking is not None:  # a take-over that failed before the sockets came
            self._taking.close()
            self._taking = None
        if self._inherited is not None:  # a take-over that failed half way
            await self._inherited.ack(False, "the successor failed to start")
            await self._inherited.close_unclaimed()
            self._inherited.close()
            self._inherited = None
        if self._handoff is not None:
            await self._handoff.stop()
            self._handoff = None
        await self._close(grace_seconds)

    async def detach(self) -> Detached:
        """Give everything but the agent proxies up to a successor (adaptor.node.handoff): the
        hypervisor socket stops accepting once its calls are answered, the background loops,
        the status API and the state store (unlocked) close. Returns the hypervisor listener
        and the status API's, still listening."""
        self._handing_off = True
        grace = self.settings.shutdown_grace_seconds
        self._handoff = None  # it is the one calling
        assert self.server is not None and self.manager is not None
        # a StartVM in flight finishes here (its VM and forwarder kept, its shim answered);
        # the proxy it made moves with the others
        hypervisor = await self.server.detach(
            grace, patient=("StartVM",), patient_seconds=STARTS_SECONDS
        )
        self.server = None
        proxies = await self.manager.hand_off(grace)
        self.manager = None
        self._moving = {i: p for i, p in proxies.items() if isinstance(p, AgentProxy)}
        for proxy in proxies.values():
            if not isinstance(proxy, AgentProxy):
                await proxy.stop()
        status = await self.status.detach() if self.status is not None else None
        self.status = None
        await self._close(grace)
        return Detached(hypervisor, status)

    async def freeze(self, moved: Callable[[str, MovedProxy], None]) -> None:
        """Then the agent proxies stop, side by side, and each one's sockets go to `moved`,
        still open, as soon as it has stopped (shims see no connection close); a proxy that
        cannot move is stopped."""
        grace = self.settings.shutdown_grace_seconds
        moving, self._moving = self._moving, {}

        async def one(sandbox_id: str, proxy: AgentProxy) -> None:
            try:
                sockets = await proxy.freeze(grace)
            except Exception as exc:
                log.error("hand-off: sandbox %s cannot move: %s", sandbox_id, exc)
                await proxy.stop()
                return
            self._moving[sandbox_id] = proxy
            moved(sandbox_id, sockets)

        await asyncio.gather(*(one(i, p) for i, p in moving.items()))

    async def take_back(self, detached: Detached, moved: dict[str, MovedProxy]) -> bool:
        """A hand-off that failed (the successor broke off, or acked a failure): once the state
        directory is free again (the successor let go of it, or died), serve everything again
        from the sockets still held here: the hypervisor and status listeners, the agent
        proxies (those not moved yet are stopped as for a move) and the moved sandboxes' copies,
        through a fresh start over the store. False when the successor still holds the state
        directory after TAKE_BACK_SECONDS (it serves; this process closes its copies). A start
        that fails stops this process cleanly (`failed`)."""
        settings = self.settings
        fd = await _lock_in_time(str(settings.state_dir), TAKE_BACK_SECONDS)
        if fd is None:
            log.error(
                "hand-off failed, but the successor still holds %s: leaving everything to it",
                settings.state_dir,
            )
            return False
        log.warning("hand-off failed: taking everything back")
        grace = settings.shutdown_grace_seconds
        moving, self._moving = self._moving, {}
        frozen = [proxy for sandbox_id, proxy in moving.items() if sandbox_id in moved]

        async def freeze(sandbox_id: str, proxy: AgentProxy) -> None:
            try:
                moved[sandbox_id] = await proxy.freeze(grace)
            except Exception as exc:
                log.error("hand-off: sandbox %s cannot be taken back: %s", sandbox_id, exc)
                await proxy.stop()
                return
            frozen.append(proxy)

        await asyncio.gather(*(freeze(i, p) for i, p in moving.items() if i not in moved))
        await asyncio.gather(*(proxy.release() for proxy in frozen), return_exceptions=True)
        self._lock_fd = fd
        self._handing_off = False
        self._inherited = Inherited(
            detached.hypervisor, dict(moved), os.getpid(), status=detached.status
        )
        moved.clear()  # the inherited sockets' now
        try:
            await self._start()
        except Exception as exc:
            log.error("hand-off: cannot serve again after a failed hand-off: %s; stopping", exc)
            await self.close(grace_seconds=0)
            self.failed = True
            self.ended.set()
            return True
        log.info("hand-off: serving everything again after the failed hand-off")
        return True

    async def handed_over(self, ok: bool) -> None:
        """The successor has the sockets (or broke off): close this process's copies; the
        daemon ends."""
        moving, self._moving = list(self._moving.values()), {}
        await asyncio.gather(*(proxy.release() for proxy in moving), return_exceptions=True)
        self.ended.set()

    async def _close(self, grace_seconds: float | None = None) -> None:
        """Shut down in the order that leaks nothing: the background loops stop; the agent
        sockets close while the hypervisor socket still answers, for at most the drain, the
        StopVMs the disconnected shims send (Kata's Go shim sends one, never retried); then
        in-flight calls get the grace and every socket closes.

        With `grace_seconds` given there is no drain longer than it. Cancelling a close (a
        second signal) closes what is left without grace.
        """
        settings = self.settings
        grace = settings.shutdown_grace_seconds if grace_seconds is None else grace_seconds
        drain = settings.shutdown_drain_seconds if grace_seconds is None else 0.0
        if self.advertiser is not None:
            await self.advertiser.stop()
            self.advertiser = None
        if self.gc is not None:
            await self.gc.stop()
            self.gc = None
        if self.reaper is not None:
            await self.reaper.stop()
            self.reaper = None
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        if self.warm is not None:
            await self._close_warm_pool()
        await self._release_shims(drain)
        if self.server is not None:
            await _graceful(self.server.close, grace)
            self.server = None
        if self.status is not None:
            await self.status.stop()
            self.status = None
        if self.metrics is not None:
            await self.metrics.stop()
            self.metrics = None
        if self.readiness is not None:
            await self.readiness.stop()
            self.readiness = None
        if self.catalogs is not None:
            await self.catalogs.stop()
            self.catalogs = None
        if self.manager is not None:
            await _graceful(self.manager.close, grace)
            self.manager = None
        # The cloud SDK calls' pool and the deletes of failed creates it runs in the background.
        if self._calls is not None:
            await _graceful(self._calls.shutdown, grace)
            self._calls = None
        if self.podnet is not None:
            await self.podnet.close()
            self.podnet = None
        if self.store is not None:
            await self.store.close()
            self.store = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _close_warm_pool(self) -> None:
        """Stop keeping the pools; with --warm-pool-drain-on-exit (an uninstall, never a
        hand-off) delete their VMs too."""
        assert self.warm is not None
        warm, self.warm = self.warm, None
        if self.manager is not None:
            self.manager.table.warm = None
        if self.settings.warm_pool_drain_on_exit and not self._handing_off:
            try:
                await warm.drain()
            except PeerpodsError as exc:
                log.error("warm pool: drain failed, its VMs stay for the next start: %s", exc)
        else:
            await warm.stop()

    async def _release_shims(self, drain_seconds: float) -> None:
        """Close every agent socket, then wait (at most `drain_seconds`) until the sandboxes
        whose shim was connected are torn down by the StopVMs those shims send. What is not
        torn down stays recorded; the next start abandons it after the reconnect grace."""
        if self.manager is None:
            return
        held = await self.manager.release_agent_sockets()
        if not held or self.server is None or drain_seconds <= 0:
            return
        log.info("shutdown: %d shims disconnected; taking their StopVMs", len(held))
        waiting = await self.manager.drain(held, drain_seconds)
        if waiting:
            log.warning(
                "shutdown: %d sandboxes not stopped within the %gs drain (%s); the next start "
                "tears them down after its reconnect grace",
                len(waiting),
                drain_seconds,
                ", ".join(sorted(waiting)[:10]),
            )


async def _graceful(close: Callable[[float], Awaitable[None]], grace: float) -> None:
    try:
        await close(grace)
    except asyncio.CancelledError:
        await close(0)
        raise


class SocketInUse(PeerpodsError):
    """A live daemon already serves the hypervisor socket."""


def _refuse_live_socket(path: str) -> None:
    """Refuse to take over a socket a live process answers on (a stale file is replaced)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(path)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return  # nothing there, or a socket file nobody listens on any more
    except OSError:
        return
    else:
        raise SocketInUse(f"another peerpods serve is serving {path}; stop it first")
    finally:
        probe.close()


def _tls_at_hand(settings: ServeSettings) -> bool:
    """Whether the agent TLS files can be loaded before the state directory is ours: the
    operator's, or the own CA a predecessor made (the own CA is made under the lock)."""
    tls = settings.agent_tls
    if not tls.enabled:
        return False
    if tls.ca_file is not None:
        return True
    pki = settings.state_dir / "pki"
    return all((pki / name).is_file() for name in ("ca.crt", "ca.key"))


async def _lock_in_time(state_dir: str, seconds: float) -> int | None:
    """The state directory's lock, waited for up to `seconds` (None: still held)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await asyncio.to_thread(_lock_state_dir, state_dir)
        except StateLocked:
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.2)


def _lock_state_dir(state_dir: str) -> int:
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateLocked(f"another peerpods serve is using {state_dir}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def raise_fd_limit() -> None:
    """The soft limit of open files up to the hard one: under containerd 2.x and systemd the
    soft limit is often 1024, and every agent connection holds two descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("open files: soft limit %d raised to %d", soft, target)


async def serve(settings: ServeSettings, **hooks: Any) -> None:
    """Run the daemon until SIGTERM or SIGINT; a second signal skips the grace period."""
    loop = asyncio.get_running_loop()
    stop, force = asyncio.Event(), asyncio.Event()

    def on_signal(signum: int) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        (force if stop.is_set() else stop).set()

    raise_fd_limit()
    daemon = Daemon(settings, **hooks)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await daemon.start()
        listening = daemon.status is not None and daemon.status.listening
        status = f" (status API {daemon.status.url})" if daemon.status and listening else ""
        print(f"peerpods serve: listening on {settings.socket}{status}", flush=True)
        ended = asyncio.create_task(daemon.ended.wait(), name="daemon-handed-over")
        stopping = asyncio.create_task(stop.wait(), name="daemon-stop")
        await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        stopping.cancel()
        if (
            daemon.ended.is_set()
            and not daemon.failed
            and settings.after_hand_off == "wait"
            and not stop.is_set()
        ):
            log.info("hand-off: holding nothing now; waiting for SIGTERM (--after-hand-off wait)")
            await stop.wait()
        closing = asyncio.create_task(daemon.close(), name="daemon-close")
        forced = asyncio.create_task(force.wait(), name="daemon-force")
        await asyncio.wait({closing, forced}, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if not closing.done():
            log.warning("second signal: closing without grace")
            closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        if daemon.failed:
            raise TakeBackFailed("a failed hand-off could not be taken back; stopped")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await daemon.close(grace_seconds=0)
