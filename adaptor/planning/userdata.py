"""Cloud-init user data for a pod VM, CAA-compatible, with each cloud's size limit checked.

The VM's agent-protocol-forwarder reads `/run/peerpod/apf.json` (CAA's keys: `pod-network`,
`pod-namespace`, `pod-name`, `tls-server-key`, `tls-server-cert`, `tls-client-ca`), so a CAA pod
VM image boots unchanged. GPU VMs also get their device layout under apf.json's `peerpods-devices`
key (`adaptor.podvm.layout`: per device its GPU, MIG profile and start slot, and the CDI name
CreateContainer will carry), which `peerpods podvm prepare` turns into MIG devices and CDI specs
before kata-agent starts; CAA's forwarder ignores the key. `/run/peerpod/devices.json` (the
older, nameless form) is still written for cloud-init images with an older pod VM half.

Each cloud's size limit is the provider registry's (`providers.clouds.registry.limit_of`: AWS
16 KiB raw, Azure 64 KiB of base64, GCP 256 KiB per metadata value). Going over is a clear
InvalidRequest before any cloud call, never a cloud-side failure.

`PodVmUserData` is StartVM's collaborator for it: one per daemon, bound to the cloud, the
adaptor's CA and the pods dir, asked once per StartVM for the sandbox and its plan.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adaptor.planning.placement import Plan
from adaptor.podnet import pod_network_section, write_apf_copy
from adaptor.podvm.layout import APF_KEY, LayoutDocument
from adaptor.proxy.pki import AdaptorPKI
from adaptor.state import SandboxRecord
from providers.clouds import registry

log = logging.getLogger(__name__)

APF_PATH = "/run/peerpod/apf.json"
DEVICES_PATH = "/run/peerpod/devices.json"
CDI_SPEC_PATH = "/var/run/cdi/nvidia.yaml"


@dataclass(frozen=True)
class MigSlot:
    """One MIG device to create at boot: its profile and first memory slot."""

    profile: str
    start: int


@dataclass(frozen=True)
class GpuSetup:
    """What the VM does with its GPUs before kata-agent starts."""

    model: str = ""
    mig: tuple[tuple[MigSlot, ...], ...] = ()
    generate_cdi: bool = True
    cdi_spec_path: str = CDI_SPEC_PATH

    @classmethod
    def from_layout(cls, layout: Any, generate_cdi: bool = True) -> GpuSetup:
        """From a providers.core.mig.MigLayout (anything with `.model` and `.per_gpu()`)."""
        return cls(
            model=str(layout.model),
            mig=tuple(
                tuple(MigSlot(p.profile, p.start) for p in group) for group in layout.per_gpu()
            ),
            generate_cdi=generate_cdi,
        )

    @classmethod
    def from_plan(cls, plan: Any, generate_cdi: bool = True) -> GpuSetup:
        """From an adaptor.devices.DevicePlan: MIG devices on the GPU indices the plan gave them
        (whole GPUs come first and carry none), so the VM creates what CreateContainer names."""
        gpus = max([m.gpu + 1 for m in plan.mig] + [len(plan.gpus)], default=0)
        groups: list[list[MigSlot]] = [[] for _ in range(gpus)]
        for device in sorted(plan.mig, key=lambda m: (m.gpu, m.start)):
            groups[device.gpu].append(MigSlot(device.profile, device.start))
        return cls(
            model=str(plan.model),
            mig=tuple(tuple(g) for g in groups) if plan.mig else (),
            generate_cdi=generate_cdi,
        )

    def to_dict(self) -> dict[str, Any]:
        """The mapping the VM's GPU setup reads (written as JSON into its user data)."""
        return {
            "v": 1,
            "gpu_model": self.model,
            "mig": [[{"profile": s.profile, "start": s.start} for s in gpu] for gpu in self.mig],
            "cdi": {
                "generate": self.generate_cdi,
                "kind": "nvidia.com/gpu",
                "spec": self.cdi_spec_path,
            },
        }


@dataclass(frozen=True)
class PodVMConfig:
    """Everything the pod VM is told at boot."""

    pod_namespace: str
    pod_name: str
    tls_server_cert: str = ""
    tls_server_key: str = ""
    tls_client_ca: str = ""
    pod_network: Mapping[str, Any] | None = None
    gpu: GpuSetup | None = None
    device_layouts: Mapping[str, Any] | None = None  # adaptor.podvm.LayoutDocument JSON
    extra_files: Sequence[tuple[str, str]] = field(default_factory=tuple)

    def apf_json(self) -> dict[str, Any]:
        """The forwarder configuration, CAA's keys (TLS keys omitted when TLS is off)."""
        config: dict[str, Any] = {
            "pod-network": dict(self.pod_network) if self.pod_network is not None else None,
            "pod-namespace": self.pod_namespace,
            "pod-name": self.pod_name,
        }
        for key, value in (
            ("tls-server-key", self.tls_server_key),
            ("tls-server-cert", self.tls_server_cert),
            ("tls-client-ca", self.tls_client_ca),
        ):
            if value:
                config[key] = value
        if self.device_layouts is not None:
            config[APF_KEY] = dict(self.device_layouts)
        return config


def render(config: PodVMConfig) -> str:
    """The `#cloud-config` document writing apf.json (and devices.json for GPU VMs)."""
    files = [(APF_PATH, json_content(config.apf_json()))]
    if config.gpu is not None:
        files.append((DEVICES_PATH, json_content(config.gpu.to_dict())))
    files.extend(config.extra_files)
    return write_files_document(files)


def json_content(document: Any) -> str:
    """A JSON file's content in the user data: compact, keys sorted."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def write_files_document(files: Sequence[tuple[str, str]]) -> str:
    """The `#cloud-config` document that writes `files` (path, content) and nothing else.

    Each `write_files` entry has `path` and `content` only, and the document nothing but
    `write_files`: CAA's process-user-data reads it strictly (yaml.v2 UnmarshalStrict into
    `write_files: [{path, content}]`), so one more key, a file's `permissions` or a `runcmd`,
    makes it refuse the whole document and write no apf.json. cloud-init then writes files 0644,
    as CAA's process-user-data does."""
    return "#cloud-config\n" + _write_files([{"path": p, "content": c} for p, c in files])


# Printable ASCII on one line: a single-quoted YAML scalar holds it with only `'` doubled.
_SINGLE_QUOTABLE = re.compile(r"[\x20-\x7e]*")


def _write_files(files: list[dict[str, str]]) -> str:
    """The `write_files` document, written directly when every value is printable ASCII on one
    line (apf.json and the device files always are): yaml.safe_dump looks at every character in
    Python, a millisecond per sandbox for the TLS keys alone. Anything else goes through it."""
    values = [value for entry in files for value in entry.values()]
    if not all(_SINGLE_QUOTABLE.fullmatch(value) for value in values):
        return str(yaml.safe_dump({"write_files": files}, sort_keys=False, width=1 << 16))
    lines = ["write_files:"]
    for entry in files:
        lead = "- "
        for key, value in entry.items():
            quoted = value.replace("'", "''")
            lines.append(f"{lead}{key}: '{quoted}'")
            lead = "  "
    return "\n".join(lines) + "\n"


def counted_size(cloud: str, user_data: str) -> int:
    """The size the cloud's limit applies to."""
    return registry.limit_of(cloud).size(user_data)


def check_size(cloud: str, user_data: str) -> None:
    """InvalidRequest, naming the cloud's limit, when `user_data` is too large for `cloud`."""
    registry.limit_of(cloud).check(user_data)


def build(cloud: str, config: PodVMConfig) -> str:
    """Render and check in one step: the user data StartVM hands to the provider."""
    user_data = render(config)
    check_size(cloud, user_data)
    return user_data


@dataclass(frozen=True)
class PodVmUserData:
    """The pod VM's user data for one cloud: apf.json with the pod network (CAA's
    `pod-network`), a server certificate from the adaptor's CA (when agent TLS is on) and the
    device layout for each GPU model the candidates may land on. With `pods_dir`, the operator's
    copy of the apf.json is kept at <pods-dir>/<id>/apf.json (mode 0600), as CAA keeps one."""

    cloud: str
    pki: AdaptorPKI | None = None
    pods_dir: Path | None = None

    def build(self, record: SandboxRecord, plan: Plan) -> str:
        """The checked `#cloud-config` for the sandbox's VM."""
        config = self.config(record, plan)
        built = build(self.cloud, config)
        if config.pod_network is None:
            log.info("sandbox %s: pod VM gets pod-network null", record.id)
        if self.pods_dir is not None:
            write_apf_copy(self.pods_dir, record.id, config.apf_json())
        return built

    def config(self, record: SandboxRecord, plan: Plan) -> PodVMConfig:
        """What the VM is told: TLS material, pod network, the device layouts by GPU model."""
        pki = self.pki
        pair = pki.issue_server(record.id) if pki is not None else None
        plans = plan.by_model
        setups = [GpuSetup.from_plan(devices) for devices in plans.values()]
        extra = tuple(
            (
                f"/run/peerpod/devices.{setup.model}.json",
                json.dumps(setup.to_dict(), sort_keys=True),
            )
            for setup in setups[1:]
        )
        return PodVMConfig(
            pod_namespace=record.pod_namespace,
            pod_name=record.pod_name,
            tls_server_cert=pair.cert_pem if pair else "",
            tls_server_key=pair.key_pem if pair else "",
            tls_client_ca=pki.ca_pem if pki is not None else "",
            pod_network=pod_network_section(record),
            gpu=setups[0] if setups else None,
            device_layouts=LayoutDocument.from_plans(plans.values()).to_dict() if plans else None,
            extra_files=extra,
        )
