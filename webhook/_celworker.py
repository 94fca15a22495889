"""Selector evaluation in worker processes that can be killed.

CEL evaluation is pure Python holding the GIL, and one builtin call (a regular expression, a
huge number) cannot be interrupted from inside: a selector evaluated in the server's process
would stall its event loop, `/healthz` and every other admission with it. So the server hands
each selector to one of a few worker processes (started from a forkserver with the CEL modules
preloaded, so a replacement starts in milliseconds) and waits on a pipe until the admission's
deadline. A worker that has not answered by then is killed and replaced; the pod is denied.

Workers are shared out by tenant (the review's namespace): one tenant holds at most `share` of
them at a time (half, at least one), and a selector of a tenant already at its share is refused
at once rather than queued, so one namespace flooding hostile selectors leaves the other workers
to everyone else. A tenant under its share waits for a free worker until its admission's
deadline, which starts when the request arrived.

A worker receives a catalog once per device space (by token) and builds the same virtual
devices the server has; it answers with the `Outcome` of `DeviceSpace.evaluate`, which enforces
the cost budget and the deadline itself whenever it can.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import queue
import signal
import threading
import time
from collections import OrderedDict
from multiprocessing.context import BaseContext
from typing import Any

from providers.core.catalog import Catalog
from webhook._devices import DeviceSpace, Outcome

__all__ = ["CelWorkers"]

log = logging.getLogger(__name__)

# Past the deadline, for a worker's own time-out answer to arrive (it checks its deadline every
# few hundred steps; a loaded node delays it): only a worker stuck in one call is killed.
_GRACE_SECONDS = 0.5
_TOO_LATE_SECONDS = 0.05  # an admission with less time left than this gets no worker
_SPACES_PER_WORKER = 4
_WARM_SELECTOR = "device.driver == 'gpu.nvidia.com'"


def _main(conn: multiprocessing.connection.Connection) -> None:
    """A worker: (space, token, catalog) and (eval, token, expression, seconds) messages."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    spaces: OrderedDict[str, DeviceSpace] = OrderedDict()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "space":
            _, token, catalog_json = message
            spaces[token] = DeviceSpace(Catalog.model_validate_json(catalog_json))
            while len(spaces) > _SPACES_PER_WORKER:
                spaces.popitem(last=False)
            continue
        _, token, expression, seconds = message
        space = spaces.get(token)
        if space is None:
            outcome = Outcome(denial="internal: the CEL worker lost its device space")
        else:
            try:
                outcome = space.evaluate(expression, time.monotonic() + seconds)
            except Exception as exc:  # a worker answers every request, whatever went wrong
                outcome = Outcome(denial=f"selector evaluation failed: {type(exc).__name__}")
        try:
            conn.send(outcome)
        except (OSError, ValueError):
            return


class _Worker:
    """One worker process and its pipe, started on first use and after each kill."""

    def __init__(self, context: BaseContext, index: int) -> None:
        self.context = context
        self.index = index
        self.process: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.spaces: set[str] = set()

    def start(self) -> None:
        parent, child = self.context.Pipe()
        process = self.context.Process(  # type: ignore[attr-defined]
            target=_main, args=(child,), name=f"peerpods-cel-{self.index}", daemon=True
        )
        process.start()
        child.close()
        self.process, self.conn, self.spaces = process, parent, set()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(5)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self.spaces = None, None, set()

    def run(self, space: DeviceSpace, expression: str, deadline: float | None) -> Outcome | None:
        """The worker's answer, or None when it had to be killed (late or broken)."""
        if self.process is None or not self.process.is_alive():
            self.stop()
            self.start()
        assert self.conn is not None
        try:
            if space.token not in self.spaces:
                self.conn.send(("space", space.token, space.catalog.model_dump_json()))
                self.spaces.add(space.token)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.conn.send(("eval", space.token, expression, 1e9 if left is None else left))
            if self.conn.poll(None if left is None else left + _GRACE_SECONDS):
                outcome: Outcome = self.conn.recv()
                return outcome
        except (OSError, EOFError, ValueError) as exc:
            log.warning("CEL worker %d failed: %s", self.index, exc)
        self.stop()
        return None


class CelWorkers:
    """A small pool of CEL worker processes; the `SelectorRunner` of `SelectorLimits`."""

    def __init__(
        self, processes: int = 2, method: str = "forkserver", share: int | None = None
    ) -> None:
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(["webhook._celworker"])
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._all = [_Worker(context, i) for i in range(processes)]
        for worker in self._all:
            self._idle.put(worker)
        self._lock = threading.Lock()
        # workers one tenant may hold at once (the rest stay for the others)
        self.share = max(1, processes // 2) if share is None else max(1, share)
        self._held: dict[str, int] = {}
        self.refusals = 0  # selectors refused because their tenant held its share
        self._revivals: set[threading.Thread] = set()
        self._warm_space: DeviceSpace | None = None
        self.kills = 0  # workers killed for running past a deadline (or breaking)

    def start(self, space: DeviceSpace | None = None) -> None:
        """Start every worker now (else each starts on first use), and with `space` have each
        build its devices and compile a selector, so no admission pays for that."""
        self._warm_space = space
        for worker in self._all:
            self._warm(worker)

    def _warm(self, worker: _Worker) -> None:
        if worker.process is None:
            worker.start()
        if self._warm_space is not None:
            worker.run(self._warm_space, _WARM_SELECTOR, time.monotonic() + 60)

    def _revive(self, worker: _Worker) -> None:
        """Start a killed worker again, warmed, before any admission may use it."""
        try:
            self._warm(worker)
        except (OSError, EOFError, ValueError) as exc:
            log.error("CEL worker %d not restarted (retried on use): %s", worker.index, exc)
            worker.stop()
        finally:
            with self._lock:
                self._revivals.discard(threading.current_thread())
            self._idle.put(worker)

    def __call__(
        self, space: DeviceSpace, expression: str, deadline: float | None, tenant: str = ""
    ) -> Outcome:
        with self._lock:
            if self._held.get(tenant, 0) >= self.share:
                self.refusals += 1
                return Outcome(refused=True)
            self._held[tenant] = self._held.get(tenant, 0) + 1
        try:
            return self._run(space, expression, deadline)
        finally:
            with self._lock:
                held = self._held[tenant] - 1
                if held:
                    self._held[tenant] = held
                else:
                    del self._held[tenant]

    def _run(self, space: DeviceSpace, expression: str, deadline: float | None) -> Outcome:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            worker = self._idle.get(timeout=left)
        except queue.Empty:
            return Outcome(busy=True)
        if deadline is not None and deadline - time.monotonic() <= _TOO_LATE_SECONDS:
            self._idle.put(worker)  # too late to start: never kill a worker for that
            return Outcome(busy=True)
        try:
            outcome = worker.run(space, expression, deadline)
        except BaseException:
            self._idle.put(worker)  # whatever happened, the pool keeps its worker
            raise
        if outcome is not None:
            self._idle.put(worker)
            return outcome
        with self._lock:
            self.kills += 1
            reviving = threading.Thread(
                target=self._revive, args=(worker,), name=f"cel-revive-{worker.index}"
            )
            self._revivals.add(reviving)
        log.warning("CEL worker killed: a selector ran past its deadline; restarting it")
        reviving.start()
        return Outcome(timed_out=True)

    def close(self) -> None:
        with self._lock:
            revivals = list(self._revivals)
        for thread in revivals:
            thread.join(70)
        for worker in self._all:
            worker.stop()
