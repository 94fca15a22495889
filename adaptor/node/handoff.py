"""Hand-off between two `serve` processes of one node: the sockets move, the pods never notice.

The running daemon listens on `<pods-dir>/.handoff` (mode 0600, and only a peer of the same uid
is answered). A successor connects and says Hello. The predecessor stops all but its agent
proxies (`Predecessor.detach`: no new hypervisor call, in-flight ones answered, its state store
closed and unlocked) and says Released. The successor opens the store, builds its parts and says
Ready, once it has dialled each running sandbox's pod VM afresh (`Predialed`: a TLS session
cannot move between processes, so the successor needs its own connections, and dialled before
Ready they cost the shims no pause). Only then the predecessor stops its proxies
(`Predecessor.freeze`: shim-side calls drained to the ones safe to repeat) and, as each one has
stopped, sends a Moved with its listening agent socket and its shim connections as SCM_RIGHTS
file descriptors; the successor serves each again as it comes, over its own connection. Last
comes the Offer with the listening hypervisor socket. The successor acks; the predecessor closes
its copies and exits. No shim connection is ever closed: both processes hold it while it moves.

If the successor breaks off after Released (or acks a failure), the predecessor takes
everything back once the state directory is free again: it still holds the hypervisor and
status listeners and a copy of every agent socket and shim connection, and serves them again
through a fresh start over the store (`Predecessor.take_back`); only when that fails too does it
stop (docs/upgrade.md).

The messages are in `adaptor.node.handoff_wire`; the blocking socket work runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from adaptor.hypervisor import AgentProxyHandle, ProxyFactory
from adaptor.proxy import AgentProxy
from adaptor.proxy.moved import MovedCall, MovedProxy, MovedShim
from adaptor.state import SandboxRecord, SandboxState
from adaptor.ttrpc.codec import DecoderState
from adaptor.ttrpc.connection import bind_unix, unlink_socket
from providers.core.base import Instance
from providers.core.errors import PeerpodsError

from .handoff_wire import (
    HEADER_BYTES,
    Ack,
    HandoffError,
    Hello,
    Message,
    Moved,
    Offer,
    Ready,
    Released,
    WireCall,
    WireSandbox,
    WireShim,
    decode,
    encode,
    frame_length,
)

log = logging.getLogger(__name__)

SOCKET_NAME = ".handoff"
# The status API's listener travels in the Offer as a sandbox of this id (one that no sandbox
# can have): a successor of the same version before it closes it as a sandbox it does not know.
STATUS_LISTENER = ":status"
FD_BATCH = 200  # descriptors per message (the kernel takes at most 253)
HELLO_SECONDS = 10.0  # a connected successor says Hello within this
OFFER_SECONDS = 120.0  # the predecessor drains its calls, then offers, within this
# A StartVM in flight (a VM booting, its forwarder awaited) is let finish within this before
# the hypervisor socket moves, so its shim is answered and its VM kept; within OFFER_SECONDS,
# which the successor waits for Released.
STARTS_SECONDS = OFFER_SECONDS - 20.0
ACK_SECONDS = 60.0  # the successor serves everything and acks within this
# The successor's dials before Ready, all side by side. The predecessor's hypervisor socket
# takes no call meanwhile, so this is short: a pod VM not reached in time is dialled later.
PREDIAL_SECONDS = 2.0


class HandoffClosed(HandoffError):
    """The other process closed the hand-off socket."""


class NoPredecessor(PeerpodsError):
    """No running `serve` answers on the hand-off socket."""


class TakeOverFailed(PeerpodsError):
    """The predecessor refused the hand-off or broke off."""


def handoff_path(pods_dir: Path) -> Path:
    """Where the running daemon waits for its successor."""
    return pods_dir / SOCKET_NAME


# --- the successor's side ---------------------------------------------------------------------


@dataclass
class Inherited:
    """What a successor received: the hypervisor listener, each sandbox's agent sockets, and
    the channel it acks on."""

    hypervisor: socket.socket
    proxies: dict[str, MovedProxy]
    predecessor_pid: int
    predialed: Predialed | None = None
    _channel: socket.socket | None = field(default=None, repr=False)
    status: socket.socket | None = None  # the status API's listener, when it had one

    def take_status(self) -> socket.socket | None:
        """The status API's listener, now the caller's to serve or close."""
        status, self.status = self.status, None
        return status

    async def adopt(self, sandbox_id: str, proxy: object) -> bool:
        """Serve the sandbox's inherited sockets with `proxy` (the manager's `adopt` hook);
        False when the predecessor did not serve it (the proxy then starts afresh). A sandbox
        served already as its sockets came (a dialled proxy) is the one given here."""
        if self.predialed is not None:
            serving = await self.predialed.served(sandbox_id, proxy)
            if serving is not None:
                return serving
        moved = self.proxies.pop(sandbox_id, None)
        if moved is None:
            return False
        if not isinstance(proxy, AgentProxy):
            moved.close()
            return False
        try:
            await proxy.adopt(moved)
        except BaseException:
            moved.close()
            raise
        return True

    async def close_unclaimed(self) -> list[str]:
        """Close the sockets no sandbox took (its record is no longer running), and stop the
        proxies dialled for them; their ids."""
        ids = sorted(self.proxies)
        for moved in self.proxies.values():
            moved.close()
        self.proxies.clear()
        if self.predialed is not None:
            await self.predialed.stop_unused()
        return ids

    async def ack(self, ok: bool, error: str = "") -> None:
        """Tell the predecessor it may exit (it does either way); the channel closes."""
        channel, self._channel = self._channel, None
        if channel is None:
            return
        try:
            await asyncio.to_thread(channel.sendall, encode(Ack(ok=ok, error=error[:1000])))
        except OSError as exc:
            log.warning("hand-off: the predecessor did not take the ack: %s", exc)
        finally:
            channel.close()

    def close(self) -> None:
        """Close everything still held (a take-over that failed half way)."""
        self.hypervisor.close()
        if self.status is not None:
            self.status.close()
            self.status = None
        for moved in self.proxies.values():
            moved.close()
        self.proxies.clear()
        if self._channel is not None:
            self._channel.close()
            self._channel = None


async def inherit(take_over: bool | None, pods_dir: Path, lock_file: Path) -> Session | None:
    """A hand-off begun with a running predecessor (its state store is unlocked when this
    returns; `Session.receive` then takes the sockets), or None to start afresh.

    `take_over` True: a running daemon must hand over (NoPredecessor otherwise); False: never
    (a live predecessor then keeps its state locked); None: only when a live daemon holds the
    same state directory and answers on the hand-off socket of the same pods dir.
    """
    if take_over is False:
        return None
    if take_over is None:
        live = await asyncio.to_thread(_locked, lock_file)
        if not live or not await asyncio.to_thread(predecessor_listening, pods_dir):
            return None
    return Session(await asyncio.to_thread(_begin, handoff_path(pods_dir)))


class Predialed:
    """Agent proxies a successor makes and dials before it says Ready; the sandbox manager's
    proxy factory then returns them, connected, so the calls moved to them are sent at once."""

    def __init__(self, factory: ProxyFactory) -> None:
        self._factory = factory
        self._proxies: dict[str, tuple[str, AgentProxyHandle]] = {}
        # sandboxes served as their sockets came: the proxy and its adoption
        self._serving: dict[str, tuple[AgentProxyHandle, asyncio.Task[None]]] = {}

    def serve(self, sandbox_id: str, moved: MovedProxy) -> bool:
        """Serve a sandbox's sockets at once with its dialled proxy (False: it has none; the
        manager's recovery serves them later)."""
        made = self._proxies.get(sandbox_id)
        if made is None or not isinstance(made[1], AgentProxy) or sandbox_id in self._serving:
            return False
        proxy = made[1]

        async def adopt() -> None:
            try:
                await proxy.adopt(moved)
            except BaseException:
                moved.close()
                raise

        task = asyncio.get_running_loop().create_task(adopt(), name=f"adopt-{sandbox_id}")
        self._serving[sandbox_id] = (proxy, task)
        return True

    async def served(self, sandbox_id: str, proxy: object) -> bool | None:
        """True once `proxy` serves the sandbox's sockets (served as they came); None when it
        was not served that way."""
        entry = self._serving.pop(sandbox_id, None)
        if entry is None:
            return None
        serving, task = entry
        try:
            await task
        except BaseException:  # the manager logs it, as any adoption's failure
            await serving.stop()
            raise
        if serving is not proxy:  # the manager made another proxy: this one must not stay
            await serving.stop()
            raise RuntimeError(f"sandbox {sandbox_id}: served by another proxy")
        return True

    def make(
        self, record: SandboxRecord, socket_path: str, host: str, port: int
    ) -> AgentProxyHandle:
        """The manager's proxy factory: the dialled proxy of `record` when there is one."""
        made = self._proxies.pop(record.id, None)
        if made is not None and made[0] == socket_path:
            return made[1]
        if made is not None:
            self._proxies[record.id] = made  # another socket: stopped with the unused ones
        return self._factory(record, socket_path, host, port)

    async def dial(
        self,
        records: Iterable[SandboxRecord],
        endpoint: Callable[[Instance], tuple[str, int]],
        seconds: float = PREDIAL_SECONDS,
    ) -> int:
        """Make a proxy for each running sandbox and dial its pod VM, side by side, for at most
        `seconds`; how many are connected."""
        for record in records:
            if record.state is SandboxState.RUNNING and record.instance is not None:
                host, port = endpoint(record.instance)
                proxy = self._factory(record, record.agent_socket, host, port)
                self._proxies[record.id] = (record.agent_socket, proxy)

        async def one(proxy: AgentProxyHandle) -> bool:
            try:
                await proxy.connect(seconds)
            except Exception as exc:  # dialled again when served: the take-over goes on
                log.info("hand-off: a pod VM was not reached before the take-over: %s", exc)
                return False
            return True

        connected = await asyncio.gather(*(one(p) for _s, p in self._proxies.values()))
        return sum(connected)

    async def stop_unused(self) -> None:
        """Stop the proxies no sandbox took (its record changed meanwhile)."""
        serving = [task for _proxy, task in self._serving.values()]
        self._serving.clear()
        await asyncio.gather(*serving, return_exceptions=True)
        unused = [proxy for _socket, proxy in self._proxies.values()]
        self._proxies.clear()
        await asyncio.gather(*(proxy.stop() for proxy in unused), return_exceptions=True)


class Session:
    """A successor's side of a hand-off between Released and the Offer."""

    def __init__(self, channel: socket.socket) -> None:
        self._channel: socket.socket | None = channel
        self._predialed: Predialed | None = None

    def predialing(self, factory: ProxyFactory) -> ProxyFactory:
        """The proxy factory to give the sandbox manager: `receive` dials its proxies first."""
        self._predialed = Predialed(factory)
        return self._predialed.make

    async def receive(
        self,
        records: Iterable[SandboxRecord] = (),
        endpoint: Callable[[Instance], tuple[str, int]] | None = None,
    ) -> Inherited:
        """Dial the running sandboxes' pod VMs (with `predialing` and an `endpoint`), say Ready
        and take the sockets (the shims wait from Ready until they are served)."""
        channel, self._channel = self._channel, None
        assert channel is not None, "received already"
        if self._predialed is not None and endpoint is not None:
            try:
                dialled = await self._predialed.dial(records, endpoint)
            except BaseException:
                channel.close()
                raise
            log.info("hand-off: %d pod VM(s) dialled before taking over", dialled)
        loop = asyncio.get_running_loop()
        later: dict[str, MovedProxy] = {}  # sandboxes the manager's recovery serves

        seen: set[str] = set()

        def arrived(sandbox_id: str, moved: MovedProxy) -> None:  # on the loop
            if sandbox_id in seen:  # named twice: the first one stays
                moved.close()
            elif self._predialed is None or not self._predialed.serve(sandbox_id, moved):
                later[sandbox_id] = moved
            seen.add(sandbox_id)

        def from_thread(sandbox_id: str, moved: MovedProxy) -> None:
            loop.call_soon_threadsafe(arrived, sandbox_id, moved)

        try:
            # `arrived` runs for every sandbox received before this returns or raises
            inherited = await asyncio.to_thread(
                _receive_offer, channel, from_thread, self._predialed
            )
        except BaseException:
            for moved in later.values():
                moved.close()
            if self._predialed is not None:
                await self._predialed.stop_unused()
            raise
        for sandbox_id, moved in later.items():
            if sandbox_id in inherited.proxies:
                moved.close()
            else:
                inherited.proxies[sandbox_id] = moved
        log.info(
            "hand-off: took over from pid %d: %d sandbox(es), %d served as they came",
            inherited.predecessor_pid,
            len(seen | set(inherited.proxies)),
            len(seen) - len(later),
        )
        return inherited

    def close(self) -> None:
        """Give up before Ready (this start failed): the predecessor then ends."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _locked(lock_file: Path) -> bool:
    """Whether another process holds the state directory's lock (blocking, instant)."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def predecessor_listening(pods_dir: Path) -> bool:
    """Whether a daemon answers on the hand-off socket (blocking; a short connect)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(handoff_path(pods_dir)))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _begin(path: Path) -> socket.socket:
    """Hello, then wait until the predecessor released its state store (blocking)."""
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        channel.settimeout(HELLO_SECONDS)
        try:
            channel.connect(str(path))
        except OSError as exc:
            raise NoPredecessor(f"no running peerpods serve at {path}: {exc.strerror}") from None
        _check_peer(channel)
        channel.settimeout(OFFER_SECONDS)
        channel.sendall(encode(Hello(pid=os.getpid())))
        message = _receive(channel)
        if isinstance(message, Ack):
            raise TakeOverFailed(f"the running serve refused the hand-off: {message.error}")
        if not isinstance(message, Released):
            raise TakeOverFailed(f"unexpected hand-off message {message.kind}")
    except (OSError, HandoffError) as exc:
        channel.close()
        raise TakeOverFailed(f"hand-off broke off: {exc}") from None
    except BaseException:
        channel.close()
        raise
    return channel


# Told each sandbox's sockets as they come (from the receiving thread).
Arrived = Callable[[str, MovedProxy], None]


def _receive_offer(
    channel: socket.socket, arrived: Arrived, predialed: Predialed | None
) -> Inherited:
    """Ready, then a Moved per sandbox (each told to `arrived` at once) and the Offer, with
    their descriptors (blocking); what came is acked on `channel`."""
    try:
        channel.sendall(encode(Ready()))
        while True:
            message = _receive(channel)
            if isinstance(message, Moved):
                fds = _receive_fds(channel, message.fd_count)
                arrived(message.sandbox.sandbox_id, _inherit_one(message.sandbox, fds))
                continue
            if not isinstance(message, Offer):
                raise TakeOverFailed(f"unexpected hand-off message {message.kind}")
            break
        fds = _receive_fds(channel, message.fd_count)
        hypervisor, proxies = _inherit(message, fds)
    except (OSError, HandoffError) as exc:
        channel.close()
        raise TakeOverFailed(f"hand-off broke off: {exc}") from None
    except BaseException:
        channel.close()
        raise
    status = proxies.pop(STATUS_LISTENER, None)
    return Inherited(
        hypervisor,
        proxies,
        message.pid,
        predialed,
        channel,
        status=status.listener if status is not None else None,
    )


def _inherit_one(sandbox: WireSandbox, fds: list[int]) -> MovedProxy:
    """Sockets for the descriptors a Moved names (as `_inherit`)."""
    with _Descriptors(fds) as sock:
        return _moved_proxy(sandbox, sock)


def _inherit(offer: Offer, fds: list[int]) -> tuple[socket.socket, dict[str, MovedProxy]]:
    """Sockets for the descriptors the Offer names (any fd it names twice or not at all is
    closed: nothing leaks, nothing is served twice)."""
    with _Descriptors(fds) as sock:
        hypervisor = sock(offer.hypervisor_fd)
        proxies = {sandbox.sandbox_id: _moved_proxy(sandbox, sock) for sandbox in offer.sandboxes}
    return hypervisor, proxies


def _moved_proxy(sandbox: WireSandbox, sock: Callable[[int], socket.socket]) -> MovedProxy:
    moved = MovedProxy(sock(sandbox.listener_fd))
    for shim in sandbox.shims:
        moved.shims.append(
            MovedShim(
                sock(shim.fd),
                shim.last_stream_id,
                DecoderState(shim.partial, shim.discard, shim.skipping),
                tuple(MovedCall(c.stream_id, c.service, c.method, c.request) for c in shim.calls),
            )
        )
    return moved


class _Descriptors:
    """Received descriptors as sockets, each taken once by its index; on leaving, the ones not
    taken are closed, and on an error all of them."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._owned: dict[int, socket.socket] = {}

    def __enter__(self) -> Callable[[int], socket.socket]:
        return self._take

    def _take(self, index: int) -> socket.socket:
        if index >= len(self._fds) or index in self._owned:
            raise HandoffError(f"descriptor {index} is missing or named twice")
        self._owned[index] = socket.socket(fileno=self._fds[index])
        return self._owned[index]

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        for index, fd in enumerate(self._fds):
            if index in self._owned:
                if kind is not None:
                    self._owned[index].close()
            else:
                os.close(fd)


def check_listener(sock: socket.socket, path: str) -> None:
    """The hypervisor listener handed over must be what this process binds itself: a listening
    unix stream socket bound in the configured directory, whose file at `path` is ours with no
    permission beyond 0660 (a shim of another user must not reach it). HandoffError says what
    is wrong (blocking: one lstat)."""
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise HandoffError(f"not a unix stream socket ({sock.family!r}, {sock.type!r})")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise HandoffError("not listening")
    name = sock.getsockname()
    if not isinstance(name, str) or os.path.dirname(name) != os.path.dirname(path):
        raise HandoffError(f"bound at {name!r}, not in the directory of {path}")
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise HandoffError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise HandoffError(f"{path} is not a socket")
    if info.st_uid != os.geteuid():
        raise HandoffError(f"{path} belongs to uid {info.st_uid}, not {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) & ~0o660:
        raise HandoffError(f"{path} has mode {stat.S_IMODE(info.st_mode):04o}, wider than 0660")


# --- the predecessor's side -------------------------------------------------------------------


@dataclass
class Detached:
    """The listeners a predecessor hands over last, still listening."""

    hypervisor: socket.socket
    status: socket.socket | None = None

    def close(self) -> None:
        self.hypervisor.close()
        if self.status is not None:
            self.status.close()


class Predecessor(Protocol):
    """What the running daemon gives up to its successor."""

    async def detach(self) -> Detached:
        """Stop everything but the agent proxies and return the hypervisor listener (a
        duplicate, still listening) and the status API's; the state store is unlocked when
        this returns."""
        ...

    async def freeze(self, moved: Callable[[str, MovedProxy], None]) -> None:
        """Stop the agent proxies, side by side, telling `moved` each one's sockets as soon as
        it has stopped (duplicates: the originals stay)."""
        ...

    async def take_back(self, detached: Detached, moved: dict[str, MovedProxy]) -> bool:
        """The successor failed: serve everything again from what is still held here (the
        listeners, the proxies not moved yet, the moved sandboxes' copies); False when it
        cannot (the successor still holds the state: `handed_over` follows)."""
        ...

    async def handed_over(self, ok: bool) -> None:
        """The successor has them (or broke off): close this process's copies and end."""
        ...


class HandoffListener:
    """Waits on `<pods-dir>/.handoff` for a successor and hands everything over, once."""

    def __init__(self, pods_dir: Path, daemon: Predecessor) -> None:
        self.path = handoff_path(pods_dir)
        self._daemon = daemon
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.busy = False  # a hand-off has begun: the daemon must not close under it

    async def start(self) -> None:
        self._listener = await asyncio.to_thread(bind_unix, str(self.path), 0o600)
        self._inode = os.lstat(self.path).st_ino
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="handoff")

    async def stop(self) -> None:
        """Stop listening (a shutdown); a hand-off already begun is left to finish."""
        if self._task is not None and not self.busy:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_listener()

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            unlink_socket(str(self.path), self._inode)  # unless another took the path

    async def _serve(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            channel, _ = await loop.sock_accept(self._listener)
            try:
                if await self._one(channel):
                    self._close_listener()  # a daemon that took back listens anew
                    return
            except Exception:  # whatever one connection did, the next successor is heard
                log.exception("hand-off: a connection failed; listening on")
            finally:
                channel.close()

    async def _one(self, channel: socket.socket) -> bool:
        """One successor: True once everything was handed over (this daemon ends)."""
        channel.setblocking(True)
        channel.settimeout(HELLO_SECONDS)
        try:
            _check_peer(channel)
            hello = await asyncio.to_thread(_receive, channel, HELLO_SECONDS)
        except HandoffClosed:
            return False  # a probe (predecessor_listening), or a successor that gave up
        except (OSError, HandoffError) as exc:
            log.warning("hand-off: ignoring a connection: %s", exc)
            return False
        if not isinstance(hello, Hello):
            log.warning("hand-off: ignoring a connection that sent %s first", hello.kind)
            return False
        log.info("hand-off: successor pid %d asks to take over", hello.pid)
        self.busy = True
        detached: Detached | None = None
        proxies: dict[str, MovedProxy] = {}
        ok = False
        try:
            detached = await self._daemon.detach()
            channel.settimeout(OFFER_SECONDS)
            await asyncio.to_thread(_send_released, channel)
            log.info("hand-off: the successor is ready; moving the agent sockets")
            channel.settimeout(ACK_SECONDS)
            await self._move(channel, detached, proxies)
            ack = await asyncio.to_thread(_receive, channel)
            ok = isinstance(ack, Ack) and ack.ok
            if not ok:
                why = ack.error if isinstance(ack, Ack) else f"sent {ack.kind}"
                log.error("hand-off: the successor failed after taking the sockets: %s", why)
        except (OSError, HandoffError) as exc:
            log.error("hand-off: the successor broke off: %s", exc)
        except Exception:
            log.exception("hand-off failed")
        finally:
            taken = False
            if not ok and detached is not None:
                try:
                    taken = await self._daemon.take_back(detached, proxies)
                except Exception:
                    log.exception("hand-off: taking everything back failed")
            if not taken:
                if detached is not None:
                    detached.close()
                for moved in proxies.values():
                    moved.close()
                await self._daemon.handed_over(ok)
        if ok:
            log.info("hand-off: pid %d serves everything now; exiting", hello.pid)
        return True

    async def _move(
        self, channel: socket.socket, detached: Detached, proxies: dict[str, MovedProxy]
    ) -> None:
        """Stop the proxies and send each one's sockets as soon as it has stopped (kept in
        `proxies`, to close once the successor has them), then the hypervisor listener."""
        sender = _Sender(channel)
        try:

            def stopped(sandbox_id: str, moved: MovedProxy) -> None:
                proxies[sandbox_id] = moved
                sender.send(*_moved(sandbox_id, moved))

            await self._daemon.freeze(stopped)
            log.info("hand-off: %d agent proxies stopped and sent", len(proxies))
            status = {}
            if detached.status is not None:
                status[STATUS_LISTENER] = MovedProxy(detached.status)
            sender.send(*_offer(detached.hypervisor, status))
        finally:
            await sender.finish()


class _Sender:
    """Sends the hand-off's messages and descriptors in order, from a thread of its own, so a
    sandbox goes out while the next ones are still stopping."""

    def __init__(self, channel: socket.socket) -> None:
        self._items: queue.SimpleQueue[tuple[bytes, list[int]] | None] = queue.SimpleQueue()
        self._failed: BaseException | None = None
        loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            if not self._done.done():
                self._done.set_result(None)

        def run() -> None:
            try:
                while (item := self._items.get()) is not None:
                    _send_message(channel, *item)
            except BaseException as exc:  # kept for `finish`; the rest is not sent
                self._failed = exc
                while self._items.get() is not None:
                    pass
            loop.call_soon_threadsafe(finished)

        threading.Thread(target=run, name="handoff-sender", daemon=True).start()

    def send(self, message: Message, fds: list[int]) -> None:
        self._items.put((encode(message), fds))

    async def finish(self) -> None:
        """Until everything given was sent; raises what failed."""
        self._items.put(None)
        await self._done
        if self._failed is not None:
            raise self._failed


def _moved(sandbox_id: str, moved: MovedProxy) -> tuple[Moved, list[int]]:
    offer, fds = _offer_fds([], {sandbox_id: moved})
    return Moved(sandbox=offer[0], fd_count=len(fds)), fds


def _offer(hypervisor: socket.socket, proxies: dict[str, MovedProxy]) -> tuple[Offer, list[int]]:
    sandboxes, fds = _offer_fds([hypervisor.fileno()], proxies)
    offer = Offer(pid=os.getpid(), hypervisor_fd=0, sandboxes=sandboxes, fd_count=len(fds))
    return offer, fds


def _offer_fds(
    fds: list[int], proxies: dict[str, MovedProxy]
) -> tuple[tuple[WireSandbox, ...], list[int]]:
    """The sandboxes as sent, their descriptors appended to `fds` in the order they name."""
    sandboxes = []
    for sandbox_id, moved in proxies.items():
        listener = len(fds)
        fds.append(moved.listener.fileno())
        shims = []
        for shim in moved.shims:
            shims.append(
                WireShim(
                    fd=len(fds),
                    last_stream_id=shim.last_stream_id,
                    partial=shim.decoder.partial,
                    discard=shim.decoder.discard,
                    skipping=shim.decoder.skipping,
                    calls=tuple(
                        WireCall(
                            stream_id=c.stream_id,
                            service=c.service,
                            method=c.method,
                            request=c.request,
                        )
                        for c in shim.calls
                    ),
                )
            )
            fds.append(shim.sock.fileno())
        sandboxes.append(
            WireSandbox(sandbox_id=sandbox_id, listener_fd=listener, shims=tuple(shims))
        )
    return tuple(sandboxes), fds


# --- blocking socket helpers (run in a thread) --------------------------------------------------


def _check_peer(channel: socket.socket) -> None:
    """Only a process of our own uid may take the sockets (the socket is 0600 as well)."""
    creds = channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        raise HandoffError(f"peer uid {uid} is not {os.getuid()}")


def _read_exactly(channel: socket.socket, count: int, deadline: float | None = None) -> bytes:
    """`count` bytes; by `deadline` (time.monotonic) in all when given, however they drip in."""
    chunks = bytearray()
    while len(chunks) < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the hand-off message did not come in time")
            channel.settimeout(left)
        chunk = channel.recv(count - len(chunks))
        if not chunk:
            raise HandoffClosed("the other side closed the hand-off")
        chunks += chunk
    return bytes(chunks)


def _receive(channel: socket.socket, seconds: float | None = None) -> Message:
    """The next message, whole within `seconds` when given (a client dripping bytes slower
    than the socket's timeout is still cut off)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    length = frame_length(_read_exactly(channel, HEADER_BYTES, deadline))
    return decode(_read_exactly(channel, length, deadline))


def _send_released(channel: socket.socket) -> None:
    """Released, then wait for the successor's Ready."""
    channel.sendall(encode(Released()))
    ready = _receive(channel)
    if not isinstance(ready, Ready):
        raise HandoffError(f"the successor sent {ready.kind}, not ready")


def _send_message(channel: socket.socket, frame: bytes, fds: list[int]) -> None:
    channel.sendall(frame)
    for start in range(0, len(fds), FD_BATCH):
        socket.send_fds(channel, [b"F"], fds[start : start + FD_BATCH])


def _receive_fds(channel: socket.socket, count: int) -> list[int]:
    fds: list[int] = []
    try:
        while len(fds) < count:
            data, got, flags, _ = socket.recv_fds(channel, 1, FD_BATCH, socket.MSG_CMSG_CLOEXEC)
            fds += got
            if not data:
                raise HandoffError("the predecessor closed before sending every socket")
            if flags & socket.MSG_CTRUNC:
                raise HandoffError("descriptors were cut short (out of file descriptors?)")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise HandoffError(f"received {len(fds)} descriptors, the offer names {count}")
    return fds
