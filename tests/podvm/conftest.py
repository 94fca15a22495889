"""A pod VM on the fake NVML: its GPUs, its /dev and /proc tree, its paths, and `prepare` on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adaptor.cdi import load_spec
from adaptor.cli.main import main
from adaptor.podvm.layout import APF_KEY, Layout, LayoutDocument
from adaptor.podvm.prepare import Options, Result, prepare
from tests.cdi.conftest import oracle  # noqa: F401  (the Go CDI library, for these tests too)
from tests.podvm import fake_nvml, fakehost


@dataclass
class PodVM:
    """One VM: the fake machine, its tree under `base/root`, and prepare's paths under `base`."""

    base: Path
    machine: fake_nvml.Machine
    rdma: int = 0
    minors: dict[str, int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.minors = fakehost.build(self.root, self.machine, rdma=self.rdma)
        fake_nvml.install(self.machine)

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def options(self) -> Options:
        return Options(
            apf_path=self.base / "run/apf.json",
            legacy_path=self.base / "run/devices.json",
            cdi_dir=self.base / "cdi",
            other_cdi_dirs=(self.base / "etc-cdi",),
            status_path=self.base / "run/podvm-status.json",
            state_dir=self.base / "state",
            root=self.root,
            reboot_command=("touch", str(self.base / "rebooted")),
        )

    def send(self, *layouts: Layout, apf: dict[str, Any] | None = None) -> None:
        """Write apf.json as the user data would: CAA's keys plus the layouts."""
        doc = dict(apf or {"pod-network": None, "pod-namespace": "default", "pod-name": "p"})
        doc[APF_KEY] = LayoutDocument(layouts=layouts).to_dict()
        self.write_apf(doc)

    def write_apf(self, doc: dict[str, Any]) -> None:
        path = self.options.apf_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=4))

    def prepare(self, **changes: Any) -> Result:
        options = self.options
        for key, value in changes.items():
            options = _replace(options, key, value)
        fake_nvml.install(self.machine)
        return prepare(options, fake_nvml, out=self.lines.append)

    def prepare_cli(self, *extra: str) -> int:
        """`peerpods podvm prepare` on the fake NVML with this VM's paths; its exit status."""
        o = self.options
        paths = {
            "--apf-json": o.apf_path,
            "--devices-json": o.legacy_path,
            "--cdi-dir": o.cdi_dir,
            "--status-file": o.status_path,
            "--state-dir": o.state_dir,
            "--root": o.root,
        }
        argv = ["podvm", "prepare", "--nvml-module", "tests.podvm.fake_nvml"]
        argv += [part for flag, path in paths.items() for part in (flag, str(path))]
        return main([*argv, *extra])

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.options.status_path.read_text())
        return data

    def spec_texts(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(self.options.cdi_dir.glob("*.json"))}

    def specs(self) -> dict[str, Any]:
        return {p.name: load_spec(str(p)) for p in sorted(self.options.cdi_dir.glob("*.json"))}

    def cap_of(self, minor: int) -> str:
        """The capability a /dev/nvidia-caps minor stands for (mig-minors read backwards)."""
        return next(cap for cap, m in self.minors.items() if m == minor)

    def device_of(self, nodes: list[tuple[str, int]]) -> tuple[int, int, int]:
        """(GPU minor, GI id, CI id) a MIG device's nodes [(path, minor)] give access to."""
        caps = sorted(self.cap_of(m) for p, m in nodes if p.startswith("/dev/nvidia-caps/"))
        assert len(caps) == 2, nodes
        ci_cap = next(c for c in caps if "/ci" in c)
        gpu, gi, ci = (
            int(part[2:] if part.startswith("gi") or part.startswith("ci") else part[3:])
            for part in ci_cap.split("/")[:3]
        )
        assert f"gpu{gpu}/gi{gi}/access" in caps
        parents = [m for p, m in nodes if p.startswith("/dev/nvidia") and "caps" not in p]
        assert parents == [gpu], nodes
        return gpu, gi, ci

    def uuid_of(self, nodes: list[tuple[str, int]]) -> str:
        gpu, gi, ci = self.device_of(nodes)
        truth = self.machine.truth()
        return next(t["uuid"] for t in truth if (t["minor"], t["gi"], t["ci"]) == (gpu, gi, ci))


def _replace(options: Options, key: str, value: Any) -> Options:
    from dataclasses import replace

    return replace(options, **{key: value})


@pytest.fixture
def make_vm(tmp_path: Path) -> Iterator[Any]:
    count = 0

    def make(model: str = "h100-80gb", gpus: int = 2, **kwargs: Any) -> PodVM:
        nonlocal count
        count += 1
        rdma = kwargs.pop("rdma", 0)
        machine = fake_nvml.Machine(model, gpus, **kwargs)
        return PodVM(tmp_path / f"vm{count}", machine, rdma=rdma)

    yield make
    fake_nvml.install(None)
