"""The sandbox lifecycle's settings (CreateVM to StopVM) and the reclaiming of VMs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from providers.core.settings import Flag, Section


def _no_colon(value: Path) -> Path:
    # The shim splits "remote:<path>" on ":", so the agent socket path must not carry one.
    if ":" in str(value):
        raise ValueError("must not contain ':'")
    return value


class SandboxSettings(Section):
    """Where agent sockets live and how long each step of a sandbox's life may take."""

    pods_dir: Annotated[Path, Flag("--pods-dir"), AfterValidator(_no_colon)] = Field(
        Path("/run/peerpod/pods"),
        description="directory of per-sandbox agent sockets, <pods-dir>/<id>/agent.ttrpc",
    )
    forwarder_port: Annotated[int, Flag("--forwarder-port")] = Field(
        15150, ge=1, le=65535, description="TCP port of the pod VM's agent protocol forwarder"
    )
    proxy_timeout_seconds: Annotated[float, Flag("--proxy-timeout", duration=True)] = Field(
        300.0, gt=0, description="how long StartVM waits for the pod VM forwarder"
    )
    start_timeout_seconds: Annotated[float, Flag("--start-timeout", duration=True)] = Field(
        900.0,
        gt=0,
        description="StartVM's own limit, whatever the caller's deadline (runtime-rs gives "
        "~10000s)",
    )
    stop_wait_seconds: Annotated[float, Flag("--stop-wait", duration=True)] = Field(
        60.0,
        ge=0,
        description="how long StopVM waits for the cloud to confirm the delete before answering "
        "(a caller's nearer deadline wins); the delete goes on, retried, until confirmed",
    )
    reconnect_grace_seconds: Annotated[float, Flag("--reconnect-grace", duration=True)] = Field(
        300.0,
        ge=0,
        description="a sandbox found running at start whose shim does not connect to its agent "
        "socket within this is treated as gone: its VM, tunnel and record are removed (Kata's Go "
        "shim never reconnects after losing its agent connection); 0s: wait forever",
    )


class ReclaimSettings(Section):
    """The reaper, the orphan collector and the preemption watcher: VMs nobody should pay for."""

    reap_grace_seconds: Annotated[float, Flag("--reap-grace", duration=True)] = Field(
        600.0,
        ge=0,
        description="a failed or stopping sandbox whose VM still runs this long after its last "
        "change gets its VM deleted (0s: never)",
    )
    gc_interval_seconds: Annotated[float, Flag("--gc-interval", duration=True)] = Field(
        300.0,
        ge=0,
        description="how often VMs owned by this node but unknown to its state are deleted "
        "(0s: never)",
    )
    preemption_check_interval_seconds: Annotated[
        float, Flag("--preemption-check-interval", duration=True)
    ] = Field(
        30.0,
        ge=0,
        description="how often the cloud is asked whether running sandboxes' VMs still exist (a "
        "Spot preemption or eviction ends the sandbox as preempted); an agent connection that "
        "drops is checked at once (0s: only then)",
    )
