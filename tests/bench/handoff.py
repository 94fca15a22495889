"""How long the shims see no answer while `serve` hands its sockets to a successor.

A node of N running sandboxes (static provider, agent TLS off): each pod VM is a fake kata-agent
in this process, each sandbox's shim holds one agent connection with Kata's long-lived calls in
flight (the pause container's WaitProcess, GetOOMEvent, a ReadStdout loop), and probes it: one
grpc.Health/Check at a time, a new one 10 ms after each answer. A successor `serve` is started
and takes everything over; the predecessor exits.

Printed, over the sandboxes: the longest a probe waited for its answer during the hand-off
(the pause that connection saw: from the moment the predecessor stops reading, its log line
"the successor is ready", to the successor's ack, "serves everything now") as p50/p99/max; the
same up to the predecessor's exit, from the successor's Hello
(the predecessor still serves while it closes its store and the successor builds its parts and
dials the pod VMs, but on a machine with few cores that work slows everyone down) and from the
successor's exec (its Python start included); the probe latency before it (the baseline); the
hand-off's wall time from the successor's exec to the predecessor's exit; and whether every shim
connection stayed open with no failed call. Exits 1 on a failed call or a closed connection.

    python tests/bench/handoff.py [--sandboxes 100] [--rounds 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import datetime
import json
import statistics
import tempfile
import time

from adaptor.ttrpc import TtrpcError
from tests.adaptor.fake_agent import FakeShim
from tests.adaptor.handoff_rig import running_node

PROBE_GAP_SECONDS = 0.01
# The predecessor's log lines at the successor's Hello, when it stops reading from the shims, and
# at the successor's ack.
ASKED = "asks to take over"
FREEZING = "the successor is ready"
HANDED = "serves everything now"


def logged_at(log: Path, what: str) -> float:
    """When (time.time()) the predecessor logged `what`, from its JSON log."""
    for line in log.read_text(errors="replace").splitlines():
        if what in line:
            stamp = json.loads(line)["time"]
            moment = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
            return moment.replace(tzinfo=datetime.UTC).timestamp()
    raise RuntimeError(f"{log}: the predecessor never logged {what!r}")


class Prober:
    """One shim's probes: (sent, answered) monotonic times, and the errors."""

    def __init__(self, shim: FakeShim) -> None:
        self.shim = shim
        self.calls: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = False

    async def run(self) -> None:
        assert self.shim.client is not None
        while not self.stop:
            sent = time.monotonic()
            try:
                await self.shim.client.call("grpc.Health", "Check", b"")
            except TtrpcError as exc:
                self.errors.append(f"{exc.code.name}: {exc.message}")
                return
            self.calls.append((sent, time.monotonic()))
            await asyncio.sleep(PROBE_GAP_SECONDS)

    def longest_wait(self, start: float, end: float) -> float:
        """The longest a probe waited, of those in flight at any time in [start, end]."""
        waits = [
            answered - sent for sent, answered in self.calls if answered >= start and sent <= end
        ]
        return max(waits, default=0.0)

    def latencies(self, end: float) -> list[float]:
        return [answered - sent for sent, answered in self.calls if answered < end]


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {p50 * 1e3:7.1f} ms   p99 {p99 * 1e3:7.1f} ms   max {ordered[-1] * 1e3:7.1f} ms"


async def main(sandboxes: int, rounds: int) -> int:
    failed = False
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        async with running_node(Path(directory), sandboxes) as node:
            probers = [Prober(shim) for shim in node.shims]
            tasks = [asyncio.create_task(p.run()) for p in probers]
            await asyncio.sleep(1.0)
            for round_ in range(1, rounds + 1):
                assert node.serve is not None
                predecessor_log = node.serve.logs[-1]
                before, before_wall = time.monotonic(), time.time()
                await node.hand_off()
                after = time.monotonic()
                await asyncio.sleep(0.5)  # the probes in flight at the end are answered
                asked = before + logged_at(predecessor_log, ASKED) - before_wall
                freezing = before + logged_at(predecessor_log, FREEZING) - before_wall
                handed = before + logged_at(predecessor_log, HANDED) - before_wall
                pauses = [p.longest_wait(freezing, handed) for p in probers]
                from_hello = [p.longest_wait(asked, after) for p in probers]
                from_exec = [p.longest_wait(before, after) for p in probers]
                baseline = [v for p in probers for v in p.latencies(before)]
                closed = sum(not shim.open for shim in node.shims)
                errors = [e for p in probers for e in p.errors] + [
                    e for shim in node.shims for e in shim.errors
                ]
                print(f"hand-off {round_}/{rounds}: {sandboxes} sandboxes")
                print(f"  no answer (pause)  {ms(pauses)}")
                print(f"  from Hello         {ms(from_hello)}")
                print(f"  from exec          {ms(from_exec)}")
                print(f"  probe before       {ms(baseline)}")
                print(f"  wall time          {after - before:.2f} s (exec to old one exiting)")
                print(f"  connections closed {closed}, failed calls {len(errors)}")
                for error in errors[:5]:
                    print(f"    {error}")
                failed = failed or bool(closed or errors)
            for prober in probers:
                prober.stop = True
            await asyncio.gather(*tasks, return_exceptions=True)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.sandboxes, args.rounds)))
