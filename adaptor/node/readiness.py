"""Whether the node daemon can take a pod: its hypervisor socket serves and its cloud answers.

`/healthz` says the process lives; `/readyz` (the DaemonSet's readiness probe) says more: a daemon
without cloud credentials, or whose socket is not up yet, is alive but would fail every pod. The
cloud is asked with the cheapest call every provider has (`list_owned`, the orphan sweep's
listing) at start and then every `interval_seconds`, so revoked credentials make the node unready
too; the probe itself only reads the last answer, never waits on the cloud. What does not stop
the node from taking pods (a catalog file that cannot be reloaded: the one in use serves) is
said after "ok", with the probe still passing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from adaptor.runtime.periodic import OwnedTask
from providers.core.base import Provider
from providers.core.errors import PeerpodsError

log = logging.getLogger(__name__)


class Readiness:
    """The last cloud answer and the socket's state, as (ready, why)."""

    def __init__(
        self,
        provider: Provider,
        serving: Callable[[], bool],
        *,
        interval_seconds: float = 60.0,
        retry_seconds: float = 5.0,
        timeout_seconds: float = 30.0,
        notes: Sequence[Callable[[], str | None]] = (),
    ) -> None:
        self.provider = provider
        self.serving = serving
        self.notes = tuple(notes)  # what /readyz reports without making the node unready
        self.interval_seconds = interval_seconds
        self.retry_seconds = retry_seconds
        self.timeout_seconds = timeout_seconds
        self.cloud_error: str | None = "the cloud has not been asked yet"
        self._task = OwnedTask("readiness")

    async def check(self) -> tuple[bool, str]:
        """(ready, why not): the probe's answer, from what is known now."""
        if not self.serving():
            return False, "the hypervisor socket does not serve yet"
        if self.cloud_error is not None:
            return False, f"{self.provider.name}: {self.cloud_error}"
        said = [note for note in (n() for n in self.notes) if note]
        return True, "; ".join(["ok", *said])

    def ready(self) -> bool:
        """Whether the node can take a pod now (what `check` says, without the reason)."""
        return self.serving() and self.cloud_error is None

    async def ask_cloud(self) -> bool:
        """One listing; True when the cloud answered."""
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await self.provider.list_owned()
        except TimeoutError:
            self._failed(f"no answer within {self.timeout_seconds:g}s")
            return False
        except PeerpodsError as exc:
            self._failed(str(exc))
            return False
        except Exception as exc:  # an SDK error a provider left unmapped: still "not ready"
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if self.cloud_error is not None:
            log.info("%s answers: ready", self.provider.name)
        self.cloud_error = None
        return True

    def _failed(self, why: str) -> None:
        if why != self.cloud_error:
            log.warning("%s does not answer, not ready: %s", self.provider.name, why)
        self.cloud_error = why

    def start(self) -> None:
        self._task.start(self._loop)

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        while True:
            answered = await self.ask_cloud()
            await asyncio.sleep(self.interval_seconds if answered else self.retry_seconds)
