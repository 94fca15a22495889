"""In-process stand-ins for the manager's collaborators: a provider and an agent proxy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from adaptor.state import SandboxRecord
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance, VMSpec
from providers.core.errors import ProviderError


class FakeProvider:
    """Creates VMs in a dict; deletes can be made to fail."""

    name = "fake"
    owner_id = "node-a"
    region = ""
    zones: tuple[str, ...] = ()
    allowed_types: tuple[str, ...] = ()
    default_type = ""

    def __init__(self) -> None:
        self.vms: dict[str, Instance] = {}
        self.specs: list[VMSpec] = []
        self.fail_delete = False
        self.fail_create: Exception | None = None
        self.deleted: list[str] = []

    async def create(self, spec: VMSpec) -> Instance:
        self.specs.append(spec)
        if self.fail_create is not None:
            raise self.fail_create
        instance = Instance(
            id=f"vm-{spec.sandbox_id}",
            name=spec.sandbox_id,
            addresses=("10.0.0.7",),
            instance_type=spec.candidates[0].instance_type if spec.candidates else "default",
            tags={TAG_OWNER: self.owner_id, TAG_SANDBOX: spec.sandbox_id},
        )
        self.vms[instance.id] = instance
        return instance

    async def delete(self, instance_id: str) -> None:
        if self.fail_delete:
            raise ProviderError("cloud said no")
        self.vms.pop(instance_id, None)
        self.deleted.append(instance_id)

    async def list_owned(self) -> list[Instance]:
        return list(self.vms.values())


@dataclass
class FakeProxy:
    """Records what the manager asked of it; `connect` may fail or block."""

    sandbox_id: str
    socket_path: str
    host: str
    port: int
    connect_error: Exception | None = None
    connect_gate: asyncio.Event | None = None
    calls: list[str] = field(default_factory=list)
    # shim connections open now; `shim_came` is set when a shim connects (`shim_connects`)
    shims: int = 0
    shim_came: asyncio.Event = field(default_factory=asyncio.Event)

    def shim_connects(self) -> None:
        """A shim connects to the agent socket (and stays)."""
        self.shims += 1
        self.shim_came.set()

    async def wait_for_shim(self) -> None:
        await self.shim_came.wait()

    async def start(self) -> None:
        self.calls.append("start")

    async def connect(self, timeout_seconds: float) -> None:
        self.calls.append("connect")
        if self.connect_gate is not None:
            await self.connect_gate.wait()
        if self.connect_error is not None:
            raise self.connect_error

    async def stop(self) -> None:
        self.calls.append("stop")


class FakeProxies:
    """A ProxyFactory that keeps every proxy it made."""

    def __init__(self) -> None:
        self.made: list[FakeProxy] = []
        self.connect_error: Exception | None = None
        self.connect_gate: asyncio.Event | None = None
        self.changed = asyncio.Event()

    async def wait_made(self, count: int) -> None:
        """Until `count` proxies were made."""
        while len(self.made) < count:
            self.changed.clear()
            await self.changed.wait()

    def __call__(self, record: SandboxRecord, socket_path: str, host: str, port: int) -> FakeProxy:
        proxy = FakeProxy(record.id, socket_path, host, port, self.connect_error, self.connect_gate)
        self.made.append(proxy)
        self.changed.set()
        return proxy
