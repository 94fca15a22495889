"""A latency-modelled cloud: a provider (the aws one against moto, the Azure and GCP ones against
the repository's fakes) behind a layer that waits as a real cloud would, so cold and warm starts
compare in one run. Tests and benchmarks only; never the production path.

What it models (docs/warm-pools.md states the figures and where they come from):

- a cold `create`: launch (the API call to a running VM), then the first boot (cloud-init, GPU
  driver, agent) and the image pull, all charged before `create` returns: the adaptor dials the
  forwarder as soon as it does, and the model's agent answers at once;
- a warm VM's launch (`launch_warm`): the launch, then, in the background, the first boot and
  the image pull, after which the guest powers itself off (the model stops the VM in the cloud
  below, as EC2 does on a guest's shutdown with InstanceInitiatedShutdownBehavior=stop);
- an adoption (`adopt_warm`): the start of a stopped VM and its boot, images already there.

Every figure is multiplied by `scale`, so a test runs in seconds what a cloud does in minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from providers.core.base import Instance, VMSpec
from providers.core.warm import TAG_WARM_POOL, WarmSpec

# Published or estimated seconds (docs/warm-pools.md, "The latency model").
LAUNCH_SECONDS = 20.0
FIRST_BOOT_SECONDS = 70.0
IMAGE_PULL_SECONDS = 60.0
START_SECONDS = 25.0


@dataclass(frozen=True)
class LatencyModel:
    """Seconds of each step, before `scale`."""

    launch: float = LAUNCH_SECONDS
    first_boot: float = FIRST_BOOT_SECONDS
    image_pull: float = IMAGE_PULL_SECONDS
    start: float = START_SECONDS
    scale: float = 0.01

    def scaled(self, seconds: float) -> float:
        return seconds * self.scale

    @property
    def cold(self) -> float:
        """StartVM to agent-ready of a cold start, as the model charges it."""
        return self.scaled(self.launch + self.first_boot + self.image_pull)

    @property
    def warm(self) -> float:
        """StartVM to agent-ready of an adoption, as the model charges it."""
        return self.scaled(self.start)


class LatencyCloud:
    """`provider` with the model's waits; everything else passes through unchanged."""

    def __init__(self, provider: Any, model: LatencyModel, *, guests: bool = True) -> None:
        self._provider = provider
        self.model = model
        # whether this layer plays the warm VMs' guests (their power-off); without, something
        # outside the adaptor's process must (`Guests`), as a real VM outlives a kill -9
        self._play_guests = guests
        self._guests: set[asyncio.Task[None]] = set()
        self.creates = 0
        self.adoptions = 0
        self.warm_launches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)

    async def create(self, spec: VMSpec) -> Instance:
        self.creates += 1
        await asyncio.sleep(self.model.scaled(self.model.launch))
        instance: Instance = await self._provider.create(spec)
        await asyncio.sleep(self.model.scaled(self.model.first_boot + self.model.image_pull))
        return instance

    async def launch_warm(self, spec: WarmSpec) -> Instance:
        self.warm_launches += 1
        await asyncio.sleep(self.model.scaled(self.model.launch))
        instance: Instance = await self._provider.launch_warm(spec)
        if self._play_guests:
            task = asyncio.get_running_loop().create_task(self._guest(instance.id))
            self._guests.add(task)
            task.add_done_callback(self._guests.discard)
        return instance

    async def _guest(self, instance_id: str) -> None:
        """The warm VM's first boot and pulls, then its own power-off."""
        await asyncio.sleep(self.model.scaled(self.model.first_boot + self.model.image_pull))
        with contextlib.suppress(Exception):  # deleted meanwhile: nothing to power off
            await self._provider.stop_warm(instance_id)

    async def adopt_warm(
        self, instance_id: str, spec: VMSpec, tags: Mapping[str, str] | None = None
    ) -> Instance:
        self.adoptions += 1
        instance: Instance = await self._provider.adopt_warm(instance_id, spec, tags)
        await asyncio.sleep(self.model.scaled(self.model.start))
        return replace(instance)

    async def close(self) -> None:
        """End the modelled guests still booting."""
        for task in list(self._guests):
            task.cancel()
        await asyncio.gather(*self._guests, return_exceptions=True)


class Guests:
    """The warm VMs' guests, played from outside the adaptor's process against moto's server
    (another cloud's fake: `running` and `power_off` overridden): every running VM of the pool
    is stopped (its own power-off) once it has run for the model's first boot and image pull.
    A kill -9 of `serve` leaves them booting, as in a cloud."""

    def __init__(self, ec2: Any, model: LatencyModel, owner: str) -> None:
        self.ec2 = ec2
        self.model = model
        self.owner = owner
        self.seen: dict[str, float] = {}  # instance id -> when first seen running
        self.powered_off: list[str] = []

    def running(self) -> list[str]:
        """The pool's VMs that run (booting, pulling)."""
        filters = [
            {"Name": f"tag:{TAG_WARM_POOL}", "Values": [self.owner]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
        out = self.ec2.describe_instances(Filters=filters)
        return [vm["InstanceId"] for r in out["Reservations"] for vm in r["Instances"]]

    def power_off(self, instance_id: str) -> None:
        """The guest's own shutdown (EC2 stops it: InstanceInitiatedShutdownBehavior=stop)."""
        self.ec2.stop_instances(InstanceIds=[instance_id])

    def step(self) -> None:
        """One look: note new running pool VMs, power off those whose time has come."""
        now = time.monotonic()
        due = self.model.scaled(self.model.first_boot + self.model.image_pull)
        for instance_id in self.running():
            since = self.seen.setdefault(instance_id, now)
            if now - since >= due and instance_id not in self.powered_off:
                self.power_off(instance_id)
                self.powered_off.append(instance_id)

    async def run(self, interval: float = 0.1) -> None:
        while True:
            await asyncio.to_thread(self.step)
            await asyncio.sleep(interval)
