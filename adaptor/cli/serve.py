"""`peerpods serve`: the node daemon Kata's remote hypervisor talks to."""

from __future__ import annotations

import argparse

from adaptor.cli import flags
from providers.clouds import registry


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (cheap: nothing heavy is imported here)."""
    flags.add(
        parser,
        "--socket",
        default="/run/peerpod/hypervisor.sock",
        help="unix socket of the hypervisor.Hypervisor service (mode 0600)",
    )
    flags.add(
        parser,
        "--pods-dir",
        default="/run/peerpod/pods",
        help="directory of per-sandbox agent sockets, <pods-dir>/<id>/agent.ttrpc",
    )
    flags.add(
        parser,
        "--state-dir",
        default="/var/lib/peerpods",
        help="directory of the durable sandbox database",
    )
    flags.add(
        parser,
        "--provider",
        default="static",
        choices=registry.names(),
        help="where pod VMs come from",
    )
    flags.add(
        parser,
        "--owner-id",
        default="",
        help="owner tag value on this node's VMs; must differ per node, as orphan sweeps delete "
        "owned VMs this node does not know (default: peerpods-<hostname>)",
    )
    flags.add(
        parser,
        "--forwarder-port",
        type=int,
        default=15150,
        help="TCP port of the pod VM's agent protocol forwarder",
    )
    flags.add(
        parser,
        "--agent-tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mutual TLS to the pod VM forwarder; without the three --agent-tls-* files the "
        "adaptor's own CA under --state-dir is used (it also issues each pod VM's server "
        "certificate, sent in the VM's user data)",
    )
    flags.add(
        parser,
        "--agent-tls-ca",
        default=None,
        help="CA file that signed the forwarders' server certificates",
    )
    flags.add(
        parser, "--agent-tls-cert", default=None, help="this adaptor's client certificate file"
    )
    flags.add(parser, "--agent-tls-key", default=None, help="this adaptor's client key file")
    flags.add(
        parser,
        "--proxy-timeout",
        type=flags.duration,
        default="5m",
        help="how long StartVM waits for the pod VM forwarder",
    )
    flags.add(
        parser,
        "--start-timeout",
        type=flags.duration,
        default="15m",
        help="StartVM's own limit, whatever the caller's deadline (runtime-rs gives ~10000s)",
    )
    flags.add(
        parser,
        "--stop-wait",
        type=flags.duration,
        default="1m",
        help="how long StopVM waits for the cloud to confirm the delete before answering (a "
        "caller's nearer deadline wins); the delete goes on, retried, until confirmed",
    )
    flags.add(
        parser,
        "--reap-grace",
        type=flags.duration,
        default="10m",
        help="a failed or stopping sandbox whose VM still runs this long after its last change "
        "gets its VM deleted (0s: never)",
    )
    flags.add(
        parser,
        "--shutdown-grace",
        type=flags.duration,
        default="10s",
        help="how long in-flight calls may finish after SIGTERM",
    )
    flags.add(
        parser,
        "--shutdown-drain",
        default="15s",
        type=flags.duration,
        help="after SIGTERM the agent sockets close first (Kata's Go shim then stops its pod "
        "with one StopVM); how long the hypervisor socket stays to take those StopVMs and "
        "finish their teardowns",
    )
    flags.add(
        parser,
        "--reconnect-grace",
        default="5m",
        type=flags.duration,
        help="a sandbox found running at start whose shim does not connect to its agent socket "
        "within this is treated as gone: its VM, tunnel and record are removed (Kata's Go shim "
        "never reconnects after losing its agent connection); 0s: wait forever",
    )
    flags.add(
        parser,
        "--allowed-machine-types",
        default="",
        help="comma-separated instance types a pod may pin with the machine_type annotation "
        "(empty: none; a pod pinning another is refused at CreateVM)",
    )
    flags.add(
        parser,
        "--allowed-images",
        default="",
        help="comma-separated pod VM images a pod may choose with the image annotation "
        "(empty: none; the node's image is used)",
    )
    flags.add(
        parser,
        "--gc-interval",
        type=flags.duration,
        default="5m",
        help="how often VMs owned by this node but unknown to its state are deleted (0s: never)",
    )
    flags.add(
        parser,
        "--preemption-check-interval",
        type=flags.duration,
        default="30s",
        help="how often the cloud is asked whether running sandboxes' VMs still exist (a Spot "
        "preemption or eviction ends the sandbox as preempted); an agent connection that drops "
        "is checked at once (0s: only then)",
    )
    flags.add(
        parser,
        "--static-endpoints",
        default="",
        help="the static provider's pod VMs, HOST:PORT[,...]; one sandbox each at a time",
    )
    flags.add(
        parser,
        "--status-address",
        default="127.0.0.1:8006",
        help="HOST:PORT of the status API (/v1/sandboxes, /healthz, /metrics); empty: off",
    )
    flags.add(
        parser,
        "--catalog-dir",
        default="",
        help="directory of instance-type catalog snapshots (default: the bundled ones)",
    )
    flags.add(
        parser,
        "--gpu-quota",
        default="",
        help="shared GPU quota pool of this node's sandboxes, KEY=LIMIT[,...]: a GPU model "
        "(h100=8), gpus:MODEL, gpus (any model), family:FAMILY (its GPUs), vcpus:FAMILY, vcpus; "
        "StartVM drops candidates over it and fails with 'quota for H100 exhausted (8/8)' when "
        "none is left (default: off)",
    )
    flags.add(
        parser,
        "--vxlan-min-id",
        type=int,
        default=555000,
        help="first VXLAN id (VNI) of pod tunnels; each sandbox holds its own until StopVM",
    )
    flags.add(parser, "--vxlan-port", type=int, default=4789, help="UDP port of pod tunnels")
    flags.add(
        parser,
        "--pod-subnet-cidrs",
        default="",
        help="CIDR[,...] the pod VM routes via the pod's gateway (e.g. the service network)",
    )
    flags.add(
        parser,
        "--host-interface",
        default="",
        help="worker interface the pod tunnels run over (default: the one of the default "
        "route); another one is a dedicated NIC, and the tunnel goes to the VM's second address",
    )
    flags.add(
        parser,
        "--ext-network-via-podvm",
        action="store_true",
        help="tell pod VMs to reach external networks through their own secondary NIC "
        "(experimental in CAA's pod VM)",
    )
    flags.add(
        parser,
        "--node-name",
        default="",
        help="the Kubernetes Node this daemon runs on: its status gets kata.peerpods.io/vm "
        "(--vm-capacity), patched at start and restored whenever it differs (needs get on "
        "nodes and patch on nodes/status); empty: not advertised",
    )
    flags.add(
        parser,
        "--vm-capacity",
        type=int,
        default=10,
        help="how many peer pods this node may run (kata.peerpods.io/vm on its Node)",
    )
    from adaptor.cli.cdi_flags import add_cdi_flags

    add_cdi_flags(parser)
    registry.add_flags(parser)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def run(args: argparse.Namespace) -> int:
    """Validate the settings, then serve until SIGTERM/SIGINT."""
    from adaptor.devices import cdi_config_from_args
    from adaptor.node.daemon import serve
    from adaptor.node.settings import ServeSettings
    from adaptor.ttrpc.loop import run as run_loop

    settings = ServeSettings.build(
        socket=args.socket,
        pods_dir=args.pods_dir,
        state_dir=args.state_dir,
        provider=args.provider,
        owner_id=args.owner_id,
        forwarder_port=args.forwarder_port,
        proxy_timeout_seconds=args.proxy_timeout,
        start_timeout_seconds=args.start_timeout,
        stop_wait_seconds=args.stop_wait,
        reap_grace_seconds=args.reap_grace,
        shutdown_grace_seconds=args.shutdown_grace,
        shutdown_drain_seconds=args.shutdown_drain,
        reconnect_grace_seconds=args.reconnect_grace,
        gc_interval_seconds=args.gc_interval,
        preemption_check_interval_seconds=args.preemption_check_interval,
        static_endpoints=args.static_endpoints,
        status_address=args.status_address,
        catalog_dir=args.catalog_dir,
        gpu_quota=args.gpu_quota,
        allowed_machine_types=_csv(args.allowed_machine_types),
        allowed_images=_csv(args.allowed_images),
        vxlan_min_id=args.vxlan_min_id,
        vxlan_port=args.vxlan_port,
        pod_subnet_cidrs=args.pod_subnet_cidrs,
        host_interface=args.host_interface,
        ext_network_via_podvm=args.ext_network_via_podvm,
        node_name=args.node_name,
        vm_capacity=args.vm_capacity,
        agent_tls={
            "enabled": args.agent_tls,
            "ca_file": args.agent_tls_ca,
            "cert_file": args.agent_tls_cert,
            "key_file": args.agent_tls_key,
        },
    )
    cdi = cdi_config_from_args(args)
    run_loop(serve(settings, provider_args=args, cdi=cdi))
    return 0
