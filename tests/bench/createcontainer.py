"""Added cost of the CreateContainer rewrite on a realistic request (40 env vars, 30 mounts,
20 annotations), against pure pass-through of the payload bytes, measured in the same run.

    python tests/bench/createcontainer.py [--iterations N]

Prints p50/p99 in microseconds per case and the added p50 over pass-through.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from adaptor.cdi import Registry
from adaptor.devices import make_hook, plan_devices
from providers.core.contract import ContainerPlan, DeviceUnit
from tests.devices.requests import create_container

PLAN = ContainerPlan(
    units=(DeviceUnit(id="g", kind="gpu", count=2),), containers={"main": ("g",), "side": ()}
)
SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [
            {
                "hostPath": f"/usr/lib/x86_64-linux-gnu/lib{i}.so",
                "containerPath": f"/usr/lib/x86_64-linux-gnu/lib{i}.so",
                "options": ["ro", "bind"],
            }
            for i in range(12)
        ],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
    },
    "devices": [
        {
            "name": str(i),
            "containerEdits": {
                "deviceNodes": [{"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}]
            },
        }
        for i in range(2)
    ],
}


def payload(name: str) -> bytes:
    extra = {f"example.com/annotation-{i}": f"value-{i}" for i in range(15)}
    extra["cdi.k8s.io/user"] = "nvidia.com/gpu=all"
    req = create_container(
        name, plan_json=PLAN.encode(), env=39, mounts=30, extra_annotations=extra
    )
    assert len(req.OCI.Annotations) == 20 and len(req.OCI.Process.Env) == 40
    return bytes(req.SerializeToString())


def measure(fn: Callable[[bytes], bytes], data: bytes, n: int) -> list[float]:
    for _ in range(min(200, n)):
        fn(data)
    out = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn(data)
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5000)
    n = parser.parse_args().iterations
    stored = plan_devices(None, PLAN.gpu_intent(), (2, "a100-80gb"))
    with tempfile.TemporaryDirectory() as d:
        Path(d, "nvidia.json").write_text(json.dumps(SPEC))
        registry = Registry([d])
        cases: dict[str, tuple[Callable[[bytes], bytes], bytes]] = {
            "pass-through": (lambda b: b, payload("main")),
            "annotations: GPU container": (make_hook(stored), payload("main")),
            "annotations: container without devices": (make_hook(stored), payload("side")),
            "edits: GPU container": (make_hook(stored, "edits", registry), payload("main")),
        }
        base = measure(*cases["pass-through"], n)
        print(f"CreateContainer payload {len(payload('main'))} bytes, {n} iterations")
        print(f"{'case':42} {'p50 us':>9} {'p99 us':>9} {'added p50 us':>13}")
        for name, (fn, data) in cases.items():
            times = base if name == "pass-through" else measure(fn, data, n)
            added = p(times, 50) - p(base, 50)
            print(f"{name:42} {p(times, 50):9.2f} {p(times, 99):9.2f} {added:13.2f}")


if __name__ == "__main__":
    main()
