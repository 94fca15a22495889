"""The pod network as the sandbox manager sees it: four async calls over blocking netlink.

    inspect   CreateVM: the pod netns -> a Tunnel (CAA config + a VNI leased to the sandbox)
    setup     StartVM, once the VM has an address: the worker end of the tunnel
    teardown  StopVM: cut the pod's traffic off; the device's deletion finishes in a task here
    deleted   until those deletions have ended (before a sandbox's record and lease go; close)
    repair    restart: re-create what is missing; NetnsGone when the pod is gone
    sweep     at start and periodically: remove tunnel parts of ours that no lease holds

VNIs are leases in the state store (pool `vxlan`), taken in the same SQLite transaction that
checks them free, so a VNI is never handed out twice while a sandbox holds it, across restarts
(CAA's in-memory counter restarts at --vxlan-min-id and collides with live pods: its #3280).
A lease goes with the sandbox's record. New leases continue after the last one handed out
(after the highest held at start), so a VNI just freed is not the next one reused.

All netlink work runs on this object's own threads, never on the event loop. A call handed to a
thread runs to its end even when its caller is cancelled (the cancellation is raised once the
thread is done), and the calls on one tunnel run one at a time: an undo or a teardown never
overtakes the setup it undoes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from adaptor.podnet import _inspect, _sweep, _tunnel
from adaptor.podnet._errors import PodNetError, VniExhausted
from adaptor.podnet._model import MAX_VNI, Tunnel, TunnelState
from adaptor.podnet._netns import NETNS_DIRS
from adaptor.runtime import OwnedTask
from adaptor.settings import PodNetworkSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
VNI_POOL = "vxlan"
# A cut-off device whose deletion failed: tried again as a whole teardown this many times.
DELETE_ATTEMPTS = 3
DELETE_BACKOFF_SECONDS = 0.2


class LocalRemote(PodNetError):
    """A tunnel's VM end is an address of the worker itself."""


def is_local(host_netns: str | None, address: str) -> bool:
    """Whether `address` is the worker's own: loopback, or on any of the worker netns's
    interfaces (blocking: one address dump)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if parsed.is_loopback or parsed.is_unspecified:
        return True
    return address in _tunnel.worker_addresses(host_netns)


class PodNetSettings(PodNetworkSettings):
    """The pod network section (CAA's networking flags) and what only this layer tunes."""

    # Where CreateVM's pod netns paths may point (the CRI's directories); not a CAA flag.
    netns_dirs: tuple[str, ...] = NETNS_DIRS
    # How often the network sweep runs after the one at start (0: only at start).
    sweep_interval_seconds: float = 300.0
    # The daemon's --owner-id: part of the tag on our VXLAN devices (empty: the default
    # owner id, peerpods-<hostname>).
    owner_id: str = ""


class VniLeases(Protocol):
    """Durable leases (the state store): one holder per VNI."""

    async def acquire_lease(
        self, pool: str, sandbox_id: str, endpoints: Sequence[str]
    ) -> str | None: ...

    async def release_lease(self, pool: str, endpoint: str) -> None: ...

    async def leases(self, pool: str) -> dict[str, str]: ...


class PodNet:
    """The worker side of every sandbox's pod network on this node."""

    def __init__(
        self,
        settings: PodNetSettings,
        leases: VniLeases,
        *,
        host_netns: str | None = None,
        threads: int = 8,
    ) -> None:
        if not 0 < settings.vxlan_min_id <= MAX_VNI:
            raise PodNetError(f"--vxlan-min-id {settings.vxlan_min_id} is outside 1..{MAX_VNI}")
        self.settings = settings
        self._leases = leases
        # None: the daemon's own netns (hostNetwork); tests name the worker netns they built.
        self._host_netns = host_netns
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="podnet")
        self._allocating = asyncio.Lock()
        self._cursor: int | None = None
        # VNIs other VXLAN devices on this node use (found by `scan`): never handed out.
        self._foreign: set[int] = set()
        # The device group that marks our VXLAN devices (the worker netns's inode and our
        # owner id: the daemon's default is peerpods-<hostname>).
        owner = settings.owner_id or f"peerpods-{socket.gethostname()}"
        self._tag = _sweep.device_tag(host_netns, owner)
        # VNI -> (its lock, callers using it): one call at a time per tunnel.
        self._tunnels: dict[int, tuple[asyncio.Lock, int]] = {}
        # VNI -> the deletion of its cut-off vxlan1 (`teardown`), until it ends.
        self._deleting: dict[int, asyncio.Task[None]] = {}
        self._sweeper = OwnedTask("podnet-sweep")
        self.sweeps = 0

    async def scan(
        self, known_sandboxes: Callable[[], Awaitable[Collection[str]]] | None = None
    ) -> set[int]:
        """At start: free the leases of sandboxes that have no record (`known_sandboxes`; a
        daemon killed inside CreateVM leaves one), sweep what no lease holds, and note the VNIs
        on the tunnel port that other VXLAN devices use (not ours, e.g. CAA's on a node taken
        over live), so none is handed out again (the check CAA added in its #3280)."""
        if known_sandboxes is not None:
            leases = await self._leases.leases(VNI_POOL)
            known = set(await known_sandboxes())
            for vni, holder in leases.items():
                if holder not in known:
                    log.warning(
                        "VNI %s was leased to sandbox %s, which has no record: freed", vni, holder
                    )
                    await self._leases.release_lease(VNI_POOL, vni)
        try:
            await self.sweep()
        except Exception as exc:  # a node the sweep cannot read still serves; it retries
            log.error("network sweep at start failed (%s): %s", type(exc).__name__, exc)
        if self._foreign:
            log.info(
                "VNIs already in use on this node by other tunnels, skipped: %s",
                ", ".join(str(v) for v in sorted(self._foreign)),
            )
        return set(self._foreign)

    async def sweep(self) -> _sweep.Removed:
        """Remove tunnel parts of ours (VXLAN devices, redirects, NOTRACK elements) whose VNI no
        lease holds; the listing comes first, the leases are read after it (see `_sweep`)."""
        found = await self._run(_sweep.find, self._host_netns, self.settings.vxlan_port, self._tag)
        held = {int(v) for v in await self._leases.leases(VNI_POOL) if v.isdigit()}
        keep = held | set(self._tunnels) | set(self._deleting)
        removed = await self._run(_sweep.remove, self._host_netns, found, keep)
        self.sweeps += 1
        # A device of ours the kernel would not delete keeps its VNI out of use until it goes.
        self._foreign = (found.foreign - keep) | removed.left
        if removed.left:
            log.error(
                "network sweep could not remove the VXLAN devices of VNIs %s: kept out of use "
                "until a later sweep removes them",
                ", ".join(str(v) for v in sorted(removed.left)),
            )
        if removed.total:
            log.warning(
                "network sweep removed tunnel parts no sandbox holds: %d VXLAN devices, "
                "%d redirects, %d NOTRACK elements",
                removed.devices,
                removed.redirects,
                removed.rules,
            )
        return removed

    def start_sweeping(self) -> None:
        """Sweep every `sweep_interval_seconds` (the first sweep is `scan`'s); `close` stops."""
        if self.settings.sweep_interval_seconds > 0:
            self._sweeper.start(self._sweep_loop)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_seconds)
            try:
                await self.sweep()
            except Exception as exc:  # the next sweep must still run
                log.error("network sweep failed (%s): %s", type(exc).__name__, exc)

    async def close(self) -> None:
        """Stop sweeping, wait for the deletions still running, then the worker threads (after
        the calls in flight)."""
        await self._sweeper.stop()
        await self.deleted()
        await asyncio.to_thread(self._executor.shutdown, True)
        _tunnel.close_sockets()

    async def _run(self, fn: Callable[..., T], *args: object, cancellable: bool = True) -> T:
        """`fn(*args)` on a worker thread. Cancelled, the call is dropped if no thread has
        started it (and `cancellable`), else waited for: when this raises CancelledError, the
        kernel is no longer being changed on the caller's behalf."""
        future = self._executor.submit(fn, *args)
        waiting = asyncio.wrap_future(future)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if not (cancellable and future.cancel()):
                while not waiting.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([waiting])
                if not waiting.cancelled():
                    waiting.exception()  # retrieved: the cancellation is what is reported
            raise

    @contextlib.asynccontextmanager
    async def _serial(self, vni: int) -> AsyncIterator[None]:
        """One call at a time on the tunnel of `vni` (its VNI is busy meanwhile: never swept),
        each after the deletion of a device a teardown of it left running."""
        lock, users = self._tunnels.get(vni, (asyncio.Lock(), 0))
        self._tunnels[vni] = (lock, users + 1)
        try:
            async with lock:
                await self.deleted(vni)
                yield
        finally:
            lock, users = self._tunnels[vni]
            if users > 1:
                self._tunnels[vni] = (lock, users - 1)
            else:
                del self._tunnels[vni]

    # --- VNIs ------------------------------------------------------------------------------------

    async def allocate_vni(self, sandbox_id: str) -> int:
        """The VNI `sandbox_id` holds, leasing the next free one if it holds none."""
        low, size = self.settings.vxlan_min_id, MAX_VNI - self.settings.vxlan_min_id + 1
        async with self._allocating:
            held = await self._leases.leases(VNI_POOL)
            mine = next((int(v) for v, s in held.items() if s == sandbox_id), None)
            if mine is not None:
                return mine
            if self._cursor is None:
                numbers = [int(v) for v in held if v.isdigit() and int(v) >= low]
                numbers += [v for v in self._foreign if v >= low]
                self._cursor = max(numbers) + 1 if numbers else low
            start = self._cursor - low
            # A VNI whose device is still being deleted is not free yet (its lease may be gone
            # with its record): a new device with it would collide on the UDP port.
            busy = self._foreign | set(self._deleting)
            span = min(size, len(held) + len(busy) + 1)
            window = [
                str(vni)
                for vni in (low + (start + k) % size for k in range(span))
                if vni not in busy
            ]
            chosen = await self._leases.acquire_lease(VNI_POOL, sandbox_id, window)
            if chosen is None:
                raise VniExhausted(
                    f"every VNI from {low} to {MAX_VNI} is held: stop pods or lower --vxlan-min-id"
                )
            self._cursor = int(chosen) + 1
            return int(chosen)

    async def release_vni(self, vni: int) -> None:
        await self._leases.release_lease(VNI_POOL, str(vni))

    # --- the lifecycle ---------------------------------------------------------------------------

    async def inspect(self, sandbox_id: str, netns: str) -> Tunnel | None:
        """CreateVM: read the pod netns and lease a VNI; None when the pod has no netns ("").

        A bad netns raises BadNetns (an InvalidRequest) with nothing held afterwards.
        """
        if not netns:
            log.info(
                "sandbox %s has no network namespace: its pod VM gets no pod network", sandbox_id
            )
            return None
        settings = self.settings
        # The lease (on the state store's thread) and the two netns reads (on one of ours) run
        # side by side; the VNI is filled in once both are done.
        allocation = asyncio.create_task(self.allocate_vni(sandbox_id))
        try:
            network = await self._run(
                functools.partial(
                    _inspect.inspect,
                    netns,
                    settings.host_interface,
                    vxlan_port=settings.vxlan_port,
                    pod_subnet_cidrs=settings.pod_subnet_cidrs,
                    external_net_via_pod_vm=settings.ext_network_via_podvm,
                    netns_dirs=settings.netns_dirs,
                    host_netns=self._host_netns,
                )
            )
            vni = await asyncio.shield(allocation)
        except BaseException:
            await asyncio.shield(self._give_back(allocation))
            raise
        network = dataclasses.replace(network, vxlan_id=vni, index=vni - settings.vxlan_min_id)
        log.info(
            "sandbox %s: pod %s on %s, VNI %d, worker %s",
            sandbox_id,
            network.pod_ip,
            network.interface,
            vni,
            network.worker_node_ip,
        )
        return Tunnel(netns=netns, network=network)

    async def _give_back(self, allocation: asyncio.Task[int]) -> None:
        """The VNI an inspection that failed had leased goes back (once the lease is taken)."""
        try:
            vni = await allocation
        except (Exception, asyncio.CancelledError):
            return  # nothing was leased
        await self.release_vni(vni)

    def remote_for(self, tunnel: Tunnel, addresses: Sequence[str]) -> str:
        """The VM end: its first address, or its second with a dedicated host interface."""
        position = 1 if tunnel.network.dedicated else 0
        if len(addresses) <= position:
            raise PodNetError(
                f"the pod VM has {len(addresses)} address(es); the tunnel needs "
                + ("a second one (--host-interface is a dedicated NIC)" if position else "one")
            )
        return addresses[position]

    async def prepare(self, tunnel: Tunnel, addresses: Sequence[str]) -> Tunnel:
        """StartVM, before any part exists: the tunnel towards the VM, to be recorded first
        (write-ahead), so whatever interrupts `setup` leaves parts a teardown knows about."""
        host = self.remote_for(tunnel, addresses)
        # An address needs no lookup, and so no worker thread (a name does: it may block).
        resolve = _tunnel.resolve_ipv4
        remote = resolve(host) if _tunnel.is_dotted(host) else await self._run(resolve, host)
        if await self._run(is_local, self._host_netns, remote):
            raise LocalRemote(
                f"the pod VM's address {remote} is one of this node's own: a VXLAN tunnel to it "
                "would send the pod's frames straight back into the pod (a loop); refused"
            )
        return tunnel.evolve(remote=remote, state=TunnelState.SETTING_UP, error="")

    async def setup(self, tunnel: Tunnel, addresses: Sequence[str] = ()) -> Tunnel:
        """StartVM: the worker end towards the VM (`tunnel.remote`, else the first of
        `addresses`); the tunnel, ready. A setup that fails or is cancelled removes what it made
        before it raises."""
        if not tunnel.remote:
            tunnel = await self.prepare(tunnel, addresses)
        remote, network = tunnel.remote, tunnel.network
        async with self._serial(tunnel.vni):
            try:
                await self._run(
                    _tunnel.setup,
                    self._host_netns,
                    tunnel.netns,
                    network,
                    remote,
                    self._tag,
                    tunnel.state is TunnelState.SETTING_UP,
                )
            except BaseException as exc:
                # Whatever part was made goes again, so a failed StartVM leaves nothing behind.
                try:
                    await self._run(
                        _tunnel.teardown,
                        self._host_netns,
                        tunnel.netns,
                        network,
                        remote,
                        cancellable=False,
                    )
                except Exception as undo_exc:
                    log.error(
                        "tunnel VNI %d: undoing a failed setup failed: %s", tunnel.vni, undo_exc
                    )
                raise exc from None
        log.info("tunnel VNI %d to %s ready in %s", tunnel.vni, remote, tunnel.netns)
        return tunnel.evolve(state=TunnelState.READY, error="")

    async def teardown(self, tunnel: Tunnel) -> None:
        """StopVM: cut the pod's traffic off (raises PodNetError when that fails); `vxlan1`'s
        deletion, which the kernel holds for an RCU grace period, and then the NOTRACK element's
        go on in a task of this object's (`deleted` waits for it; so do `close`, the next call
        on this tunnel, and the sandbox's teardown before its record and VNI lease go). Until
        it ends, the VNI is neither handed out nor swept. Idempotent."""
        async with self._serial(tunnel.vni):
            doomed = await self._run(
                _tunnel.cut,
                self._host_netns,
                tunnel.netns,
                tunnel.network,
                tunnel.remote,
                cancellable=False,
            )
            self._deleting[tunnel.vni] = asyncio.create_task(
                self._delete(tunnel, doomed), name=f"podnet-delete-{tunnel.vni}"
            )
        log.info("tunnel VNI %d cut off in %s", tunnel.vni, tunnel.netns)

    async def _delete(self, tunnel: Tunnel, doomed: _tunnel.Doomed) -> None:
        """The cut-off device deleted, then the NOTRACK element; retried as a whole teardown, then
        left to the sweep (the VNI stays out of use until the next sweep, which removes what is
        left once no lease holds it)."""
        try:
            try:
                await self._run(_tunnel.delete, doomed, cancellable=False)
            except PodNetError as exc:
                log.warning("tunnel VNI %d in %s: %s; retrying", tunnel.vni, tunnel.netns, exc)
                await self._retry_teardown(tunnel)
            log.info("tunnel VNI %d removed from %s", tunnel.vni, tunnel.netns)
        except Exception as exc:  # owned here: logged, and the sweep owes the device
            self._foreign.add(tunnel.vni)
            log.error(
                "tunnel VNI %d in %s: removing the cut-off device and NOTRACK element failed "
                "(%s: %s); the VNI stays out of use until the network sweep removes them",
                tunnel.vni,
                tunnel.netns,
                type(exc).__name__,
                exc,
            )
        finally:
            del self._deleting[tunnel.vni]

    async def _retry_teardown(self, tunnel: Tunnel) -> None:
        for attempt in range(DELETE_ATTEMPTS):
            await asyncio.sleep(DELETE_BACKOFF_SECONDS * (attempt + 1))
            try:
                await self._run(
                    _tunnel.teardown,
                    self._host_netns,
                    tunnel.netns,
                    tunnel.network,
                    tunnel.remote,
                    cancellable=False,
                )
                return
            except PodNetError:
                if attempt == DELETE_ATTEMPTS - 1:
                    raise

    async def deleted(self, vni: int | None = None) -> None:
        """Until the device deletion `teardown` left running for `vni` (None: every one) has
        ended; the kernel has then removed the device (or the sweep owes it, logged)."""
        tasks = list(self._deleting.values()) if vni is None else [self._deleting.get(vni)]
        running = [t for t in tasks if t is not None]
        if running:
            await asyncio.wait(running)

    async def repair(self, tunnel: Tunnel) -> Tunnel:
        """Restart: re-create a missing device, redirect or rule; NetnsGone when the pod is gone."""
        if not tunnel.remote:
            return tunnel
        async with self._serial(tunnel.vni):
            health = await self._run(
                _tunnel.check, self._host_netns, tunnel.netns, tunnel.network, tunnel.remote
            )
            if health.whole:
                return tunnel.evolve(state=TunnelState.READY, error="")
            log.warning(
                "tunnel VNI %d in %s lacks %s; re-creating",
                tunnel.vni,
                tunnel.netns,
                ", ".join(health.missing),
            )
            await self._run(
                _tunnel.setup,
                self._host_netns,
                tunnel.netns,
                tunnel.network,
                tunnel.remote,
                self._tag,
            )
        return tunnel.evolve(state=TunnelState.READY, error="")
