"""`peerpods node install|uninstall`: set a worker node up for `kata-remote` pods, or undo it.

peerpods node install [--host-root /host] [--restart-command CMD] [--version-command CMD] [--wait]
peerpods node uninstall [--host-root /host] [--restart-command CMD]
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys

from adaptor.cli import flags


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the actions and their flags (no heavy imports)."""
    sub = parser.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    install = sub.add_parser(
        "install", help="write Kata's remote configuration and the containerd drop-in"
    )
    uninstall = sub.add_parser("uninstall", help="remove exactly what install wrote")
    for child in (install, uninstall):
        _common(child)
    install.add_argument(
        "--wait",
        action="store_true",
        help="after installing, stay until SIGTERM (a DaemonSet's container)",
    )


def _common(parser: argparse.ArgumentParser) -> None:
    """The flags install and uninstall share, in the order `--help` lists them."""
    _host_paths(parser)
    _kata_runtime(parser)
    _snapshotter_and_restart(parser)


def _host_paths(parser: argparse.ArgumentParser) -> None:
    """Where the host's files are: containerd's and Kata's configuration, install's record."""
    flags.add(
        parser,
        "--host-root",
        default="/",
        help="where the host's filesystem is mounted in this container (paths below are the "
        "host's own)",
    )
    flags.add(
        parser,
        "--containerd-config",
        default="/etc/containerd/config.toml",
        help="containerd's main configuration (version 2: containerd 1.7; 3: containerd 2.x)",
    )
    flags.add(
        parser,
        "--containerd-dropin",
        default="/etc/containerd/conf.d/50-peerpods-kata-remote.toml",
        help="the drop-in written and imported",
    )
    flags.add(
        parser,
        "--kata-config",
        default="/opt/peerpods/share/kata/configuration-remote.toml",
        help="Kata's remote configuration (the runtime's ConfigPath)",
    )
    flags.add(
        parser,
        "--kata-source",
        default="",
        help="the Kata configuration to start from (default: the configuration-remote.toml "
        "kata-deploy installs for --kata-shim; 'none': write the whole file)",
    )
    flags.add(
        parser,
        "--install-record",
        default="/var/lib/peerpods/node-install.json",
        help="what install wrote, read by uninstall",
    )


def _kata_runtime(parser: argparse.ArgumentParser) -> None:
    """The runtime containerd is told of: its handler, Kata's shim, the socket it dials."""
    flags.add(parser, "--handler", default="kata-remote", help="the RuntimeClass handler")
    flags.add(
        parser,
        "--runtime-type",
        default="io.containerd.kata.v2",
        help="containerd runtime_type of the Kata shim",
    )
    flags.add(
        parser,
        "--kata-shim",
        default="go",
        choices=["go", "rs"],
        help="Kata's Go runtime or runtime-rs (their remote configurations differ)",
    )
    flags.add(
        parser,
        "--shim-path",
        default="",
        help="the Kata shim binary (default: where kata-deploy puts the --kata-shim one)",
    )
    flags.add(
        parser,
        "--socket",
        default="/run/peerpod/hypervisor.sock",
        help="the hypervisor socket `peerpods serve` listens on",
    )


def _snapshotter_and_restart(parser: argparse.ArgumentParser) -> None:
    """Where pod images are pulled, and how containerd is made to read the change."""
    flags.add(
        parser,
        "--snapshotter",
        default="auto",
        help="the runtime's snapshotter, which pulls images in the pod VM (auto: a nydus proxy "
        "plugin the node declares, else kata-deploy's nydus-for-kata-tee; '': containerd's "
        "default, which pulls on the node, where a remote VM cannot see them)",
    )
    flags.add(
        parser,
        "--nydus-address",
        default="",
        help="the snapshotter's socket, when the installer declares it as containerd's proxy "
        "plugin (default: /run/NAME/containerd-nydus-grpc.sock, kata-deploy's; for `nydus`, "
        "nydus-snapshotter's own /run/containerd-nydus/containerd-nydus-grpc.sock)",
    )
    flags.add(
        parser,
        "--containerd-version",
        default="auto",
        help="the node's containerd version, e.g. 1.7 (auto: ask --version-command)",
    )
    flags.add(
        parser,
        "--version-command",
        default="containerd --version",
        help="prints the node's containerd version, e.g. 'nsenter --target 1 --mount -- "
        "containerd --version' from a container",
    )
    flags.add(
        parser,
        "--restart-command",
        default="",
        help="run when containerd's configuration changed, e.g. 'nsenter -t 1 -m -- systemctl "
        "restart containerd' (default: nothing is restarted; containerd reads a new runtime "
        "only when it starts)",
    )


def run(args: argparse.Namespace) -> int:
    """Install or uninstall, say what changed, restart only what was asked."""
    from pathlib import Path

    from adaptor.node.install import NodeInstall, install, uninstall

    settings = NodeInstall.build(
        host_root=Path(args.host_root),
        containerd_config=args.containerd_config,
        dropin=args.containerd_dropin,
        kata_config=args.kata_config,
        record=args.install_record,
        handler=args.handler,
        runtime_type=args.runtime_type,
        shim=args.kata_shim,
        shim_path=args.shim_path,
        socket=args.socket,
        snapshotter=args.snapshotter,
        nydus_address=args.nydus_address,
        kata_source=args.kata_source,
        containerd_version=args.containerd_version,
        version_command=args.version_command,
    )
    outcome = install(settings) if args.node_command == "install" else uninstall(settings)
    for note in outcome.notes:
        print(note)
    for path in outcome.written:
        print(f"wrote {path}")
    for path in outcome.removed:
        print(f"removed {path}")
    for path in outcome.kept:
        print(f"kept {path} (changed since install)")
    if not (outcome.written or outcome.removed):
        print("nothing to change")
    if outcome.containerd_changed:
        if args.restart_command:
            print(f"running: {args.restart_command}", flush=True)
            done = subprocess.run(shlex.split(args.restart_command), check=False)
            if done.returncode != 0:
                print(f"peerpods node: restart command exited {done.returncode}", file=sys.stderr)
                return 1
        else:
            print("containerd reads the change when it restarts (not restarted here)")
    if getattr(args, "wait", False):
        waited = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, waited)
        print("installed; waiting for SIGTERM", flush=True)
        signal.sigwait(waited)
    return 0
