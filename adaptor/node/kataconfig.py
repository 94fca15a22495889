"""Kata's remote hypervisor configuration: which keys peerpods needs set in the file Kata
installed, and the whole file for a node where Kata installed none.

Kata's Go runtime has no default for some settings that only its generated file carries
(`create_container_timeout`: without it every CreateContainer gets a 0 s deadline), so the
installer starts from that file and changes only what peerpods needs; a key the file lacks is
added with the value Kata's own file gives it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from adaptor.toml.edit import Edit

Shim = Literal["go", "rs"]

# The hypervisor keys the webhook writes and the adaptor reads, as plain names: the Go shim
# matches `enable_annotations` as unanchored regexps, and a plain name means the same either way.
ANNOTATIONS = (
    "default_vcpus",
    "default_memory",
    "default_gpus",
    "default_gpu_model",
    "machine_type",
    "image",
    "cc_init_data",
)

# Where kata-deploy installs each shim's remote configuration (under its /opt/kata).
INSTALLED = {
    "go": "/opt/kata/share/defaults/kata-containers/configuration-remote.toml",
    "rs": "/opt/kata/share/defaults/kata-containers/runtime-rs/configuration-remote.toml",
}

REMOTE = ("hypervisor", "remote")
AGENT = ("agent", "kata")
RUNTIME = ("runtime",)


def _admitted(patterns: list[str], name: str) -> bool:
    for pattern in patterns:
        try:
            if re.search(pattern, name):
                return True
        except re.error:
            continue
    return False


def _table(document: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any]:
    table: Any = document
    for part in path:
        table = table.get(part, {}) if isinstance(table, Mapping) else {}
    return table if isinstance(table, Mapping) else {}


def required_edits(document: Mapping[str, Any], shim: Shim, socket: str) -> list[Edit]:
    """The keys of `document` (a parsed Kata configuration) that peerpods must set.

    Always: the hypervisor socket `serve` listens on; annotations the contract needs that
    `enable_annotations` does not admit yet (appended); no network of the shim's own; the VM
    sized by the adaptor, not the shim. Only where missing: the timeouts Kata's file carries.
    """
    remote = _table(document, REMOTE)
    runtime = _table(document, RUNTIME)
    agent = _table(document, AGENT)
    edits: list[Edit] = []

    def want(table: tuple[str, ...], key: str, value: Any, current: Mapping[str, Any]) -> None:
        if current.get(key) != value:
            edits.append(Edit(table, key, value))

    def default(table: tuple[str, ...], key: str, value: Any, current: Mapping[str, Any]) -> None:
        if key not in current:
            edits.append(Edit(table, key, value))

    want(REMOTE, "remote_hypervisor_socket", socket, remote)
    default(REMOTE, "remote_hypervisor_timeout", 600, remote)
    enabled = remote.get("enable_annotations", [])
    enabled = [p for p in enabled if isinstance(p, str)] if isinstance(enabled, list) else []
    missing = [name for name in ANNOTATIONS if not _admitted(enabled, name)]
    if missing or "enable_annotations" not in remote:
        edits.append(Edit(REMOTE, "enable_annotations", [*enabled, *missing]))
    if shim == "rs":
        want(RUNTIME, "name", "virt_container", runtime)
        want(RUNTIME, "hypervisor_name", "remote", runtime)
        want(RUNTIME, "agent_name", "kata", runtime)
    want(RUNTIME, "internetworking_model", "none", runtime)
    # runtime-rs hands the pod's netns path on only from a netns of its own; the Go shim must
    # make none
    want(RUNTIME, "disable_new_netns", shim == "go", runtime)
    want(RUNTIME, "static_sandbox_resource_mgmt", True, runtime)
    if shim == "go":
        default(AGENT, "dial_timeout", 30, agent)
        default(RUNTIME, "create_container_timeout", 60, runtime)
    else:
        default(AGENT, "dial_timeout_ms", 30000, agent)
        default(AGENT, "create_container_timeout", 60, agent)
    return edits


_HEADER = """\
# Kata Containers' remote hypervisor configuration for peer pods, written by
# `peerpods node install` on a node where Kata installed none. It has the tables and keys of
# the file Kata generates for its remote hypervisor, with the values Kata gives them; the
# hypervisor socket is the one `peerpods serve` listens on.
"""

_GO = """
[hypervisor.remote]
# The adaptor's hypervisor socket (`peerpods serve --socket`).
remote_hypervisor_socket = {socket}
# StartVM waits for the cloud VM to boot: seconds.
remote_hypervisor_timeout = 600
# Pod annotations the shim passes on to CreateVM (unanchored regexps).
enable_annotations = {annotations}
firmware = ""
default_bridges = 1
memory_slots = 10
enable_debug = false
guest_hook_path = ""
disable_selinux = false
# The pod VM is not the shim's guest: no SELinux labels from here.
disable_guest_selinux = true

[agent.kata]
enable_debug = false
enable_tracing = false
debug_console_enabled = false
# Seconds to connect to the agent (through the adaptor's proxy).
dial_timeout = 30

[runtime]
enable_debug = false
# The adaptor makes the pod VM's network: the shim makes none.
internetworking_model = "none"
disable_guest_seccomp = true
guest_selinux_label = ""
enable_tracing = false
jaeger_endpoint = ""
jaeger_user = ""
jaeger_password = ""
disable_new_netns = true
sandbox_cgroup_only = false
# The adaptor sizes the VM from the pod: the shim never resizes it.
static_sandbox_resource_mgmt = true
vfio_mode = "guest-kernel"
disable_guest_empty_dir = false
emptydir_mode = "shared-fs"
experimental = []
enable_pprof = false
# Seconds for CreateContainer, the guest's image pull included. The Go runtime has no default:
# without this key every container fails at once.
create_container_timeout = 60
dan_conf = "/run/kata-containers/dans"
kubelet_root_dir = "/var/lib/kubelet"
pod_resource_api_sock = ""
"""

_RS = """
[hypervisor.remote]
# The adaptor's hypervisor socket (`peerpods serve --socket`).
remote_hypervisor_socket = {socket}
# StartVM waits for the cloud VM to boot: seconds.
remote_hypervisor_timeout = 600
# Pod annotations the shim passes on to CreateVM.
enable_annotations = {annotations}
kernel_params = ""
firmware = ""
default_vcpus = 1
default_maxvcpus = 0
default_bridges = 1
default_memory = 2048
memory_slots = 10
enable_debug = false
guest_hook_path = ""
disable_selinux = false
disable_guest_selinux = true

[agent.kata]
enable_debug = false
enable_tracing = false
debug_console_enabled = false
# Milliseconds to connect to the agent (through the adaptor's proxy).
dial_timeout_ms = 30000
# Seconds for CreateContainer, the guest's image pull included.
create_container_timeout = 60

[runtime]
enable_debug = false
# The adaptor makes the pod VM's network: the shim makes none.
internetworking_model = "none"
name = "virt_container"
hypervisor_name = "remote"
agent_name = "kata"
disable_guest_seccomp = true
enable_tracing = false
jaeger_endpoint = ""
jaeger_user = ""
jaeger_password = ""
# runtime-rs passes the pod's network namespace on from one of its own.
disable_new_netns = false
sandbox_cgroup_only = false
# The adaptor sizes the VM from the pod: the shim never resizes it.
static_sandbox_resource_mgmt = true
vfio_mode = "guest-kernel"
emptydir_mode = "shared-fs"
experimental = []
enable_pprof = false
dan_conf = "/run/kata-containers/dans"
"""


def complete(shim: Shim, socket: str) -> str:
    """The whole remote configuration, for a node where Kata installed none."""
    from adaptor.toml.write import value

    body = (_GO if shim == "go" else _RS).format(
        socket=value(socket), annotations=value(list(ANNOTATIONS))
    )
    return _HEADER + body
