"""The StartVM walk: which functions a StartVM passes through, from the ttrpc handler to the
provider's create call, and how often it enters `adaptor/planning/placement.py`.

A stop is a call into the project's own code (`adaptor`, `providers`) made by the daemon's
orchestration (`adaptor.hypervisor`, `adaptor.planning`, `adaptor.node`) or by the event loop
(a task's first step); what a library layer does inside (selection, the device planner, the
state store) is one stop, its entry. Each coroutine counts once, however often it resumes, and
comprehensions are part of the function they stand in. The walk runs a StartVM of a one-GPU pod
over the bundled us-east-1 catalog with user data, as `serve` does for AWS (the provider and the
agent proxy are the tests' fakes).

    python -m tests.bench.startvm_walk          # the walk, one line per stop, then the totals
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from adaptor.hypervisor import ManagerConfig, SandboxManager, SandboxTable
from adaptor.hypervisor.service import HypervisorService
from adaptor.node.catalogs import PlacementInUse
from adaptor.planning.placement import Placement
from adaptor.planning.userdata import PodVmUserData
from adaptor.state import StateStore
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.ttrpc.server import CallContext
from providers.core.snapshots import load_snapshot
from tests.adaptor.fakes import FakeProvider, FakeProxies
from tests.adaptor.test_sandboxes import ANNOTATIONS

ROOT = Path(__file__).resolve().parents[2]
WALKERS = ("adaptor/hypervisor/", "adaptor/planning/", "adaptor/node/")
PLACEMENT = "adaptor/planning/placement.py"
COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")


def _where(frame: FrameType | None) -> str:
    """The frame's file relative to the repository ('' outside the project's packages)."""
    if frame is None:
        return ""
    name = frame.f_code.co_filename
    if not name.startswith(str(ROOT)):
        return ""
    relative = name[len(str(ROOT)) + 1 :]
    return relative if relative.startswith(("adaptor/", "providers/")) else ""


def _caller(frame: FrameType) -> FrameType | None:
    """The frame that called `frame`, past generated code (a dataclass's `__init__`)."""
    back = frame.f_back
    while back is not None and back.f_code.co_filename.startswith("<"):
        back = back.f_back
    return back


class Walk:
    """Records the stops between the StartVM handler and the provider's create."""

    def __init__(self) -> None:
        self.stops: list[tuple[str, str]] = []
        self.callers: list[str] = []  # the module each stop was called from ("": the loop)
        self.seen: set[FrameType] = set()
        self.on = False
        self.done = False

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        code = frame.f_code
        if code.co_name == "start_vm" and code.co_filename.endswith("hypervisor/service.py"):
            self.on = True
        if not self.on or frame in self.seen:
            return
        if code.co_name == "create" and code.co_filename.endswith("tests/adaptor/fakes.py"):
            self.stops.append(("provider", "create"))
            self.callers.append("")
            self.done = True
            return
        where = _where(frame)
        if not where or code.co_name in COMPREHENSIONS:
            return
        caller = _where(_caller(frame))
        if caller and not caller.startswith(WALKERS):
            return  # inside a library layer: its entry was the stop
        self.seen.add(frame)
        self.stops.append((where, code.co_qualname))
        self.callers.append(caller)

    def placement_entries(self) -> int:
        """Times the walk went on in placement.py after a stop elsewhere (returns included)."""
        entries, previous = 0, ""
        for where, _ in self.stops:
            if where == PLACEMENT and previous != PLACEMENT:
                entries += 1
            previous = where
        return entries

    def placement_calls(self) -> int:
        """Calls into placement.py from another module."""
        return sum(
            1
            for (where, _), caller in zip(self.stops, self.callers, strict=True)
            if where == PLACEMENT and caller != PLACEMENT
        )


async def walk() -> Walk:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        manager = SandboxManager(
            SandboxTable(
                ManagerConfig(pods_dir=Path(root) / "pods", proxy_timeout_seconds=1),
                store,
                FakeProvider(),
                # as `serve` gives it: the placement in use (a catalog reload puts a new one there)
                PlacementInUse(Placement(catalog=load_snapshot("aws", "us-east-1"))),
                FakeProxies(),
                user_data=PodVmUserData("aws").build,
            )
        )
        service = HypervisorService(manager)
        await manager.create_vm("sb1", ANNOTATIONS)
        recorder = Walk()
        payload = pb.StartVMRequest(id="sb1").SerializeToString()
        sys.setprofile(recorder.profile)
        try:
            await service.start_vm(CallContext("hypervisor.Hypervisor", "StartVM", (), 0), payload)
        finally:
            sys.setprofile(None)
        await manager.close(0)
        await store.close()
        return recorder


def main() -> None:
    recorder = asyncio.run(walk())
    for where, name in recorder.stops:
        print(f"{where:40} {name}")
    modules = {where for where, _ in recorder.stops}
    hops = sum(1 for a, b in zip(recorder.stops, recorder.stops[1:], strict=False) if a[0] != b[0])
    print(
        f"{len(recorder.stops)} stops across {len(modules)} modules ({hops} moves between "
        f"modules); placement.py entered {recorder.placement_entries()} times "
        f"({recorder.placement_calls()} calls into it from other modules)"
    )


if __name__ == "__main__":
    main()
