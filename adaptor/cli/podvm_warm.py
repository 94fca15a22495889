"""`peerpods podvm warm` and `peerpods podvm cdh-config`: a warm pool VM's two boots.

`warm` (the warm boot, before kata-agent): exit 0 at once on a pod's boot (apf.json without
`peerpods-warm`); on a warm boot it pulls, writes its status, cleans cloud-init's state and
powers off, then exits 0, or 1 when a step failed (the power-off is asked for all the same);
2 on an apf.json that cannot be read at all (nothing done, no power-off: it may be a pod's).
`cdh-config` (every boot, before CDH): exit 0 when the files match the store (none for an empty
store), 1 when the operator's CDH configuration cannot be extended (nothing written: CDH starts
as CAA starts it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from adaptor.cli import flags


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `warm` and `cdh-config` to `peerpods podvm`."""
    from adaptor.cli.settings import PodvmCdhConfigSettings, PodvmWarmSettings

    warm = sub.add_parser(
        "warm",
        help="on a warm pool VM's first boot: pull the pool's images, power off",
        description="On a warm pool VM's boot (apf.json with peerpods-warm): pull the listed "
        "images into the store on the image's persistent partition, write a status file, clean "
        "cloud-init's state where it is installed, power off. On a pod's boot: nothing. Exit "
        "status: 0 done or nothing to do; 1 a step failed (the VM still powers off); 2 an "
        "unreadable apf.json.",
    )
    flags.add_settings(warm, PodvmWarmSettings)
    cdh = sub.add_parser(
        "cdh-config",
        help="before CDH starts: offer the pre-pulled images to its image puller",
        description="When the image store holds images: write a registries.conf whose mirrors "
        "are the loopback image mirror, and a CDH configuration (the operator's, or CDH's "
        "defaults) naming it. With an empty store nothing is written. Exit status: 0 done; 1 "
        "the operator's configuration cannot be extended (nothing written).",
    )
    flags.add_settings(cdh, PodvmCdhConfigSettings)


def run(args: argparse.Namespace) -> int:
    if args.podvm_command == "warm":
        return _warm(args)
    return _cdh_config(args)


def _warm(args: argparse.Namespace) -> int:
    from adaptor.cli.settings import PodvmWarmSettings
    from adaptor.podvm.warmboot import WarmOptions, warm
    from adaptor.podvm.warmrequest import WarmRequestError
    from providers.core.errors import InvalidRequest

    settings = flags.section(PodvmWarmSettings, args)
    pull = shlex.split(settings.pull_command) or [
        sys.executable,
        *("-m", "adaptor.cli.main", "--log-format", "text", "podvm", "pull-images"),
    ]
    poweroff = shlex.split(settings.poweroff_command)
    if not poweroff:
        raise InvalidRequest("--poweroff-command: empty")
    options = WarmOptions(
        apf_path=Path(settings.apf_json),
        store=Path(settings.store),
        status_path=Path(settings.warm_status_file),
        pull_command=tuple(pull),
        poweroff_command=tuple(poweroff),
        cloud_init=settings.cloud_init,
        auth=Path(settings.auth) if settings.auth else None,
        pull_timeout_seconds=settings.pull_timeout_seconds,
        pull_attempts=settings.pull_attempts,
        mountinfo=Path(settings.mountinfo),
    )
    try:
        result = warm(options, out=lambda line: print(line, flush=True))
    except WarmRequestError as exc:
        raise InvalidRequest(str(exc)) from None
    if result.errors:
        print(f"peerpods podvm warm: {'; '.join(result.errors)}", file=sys.stderr)
    return result.exit_code


def _cdh_config(args: argparse.Namespace) -> int:
    from adaptor.cli.settings import PodvmCdhConfigSettings
    from adaptor.podvm.cdhconfig import CdhConfigError, CdhOptions, configure_cdh

    settings = flags.section(PodvmCdhConfigSettings, args)
    options = CdhOptions(
        store=Path(settings.store),
        operator_config=Path(settings.operator_config),
        registries_conf=Path(settings.registries_conf),
        cdh_config=Path(settings.cdh_config),
        mirror_address=settings.mirror,
        cmdline=Path(settings.cmdline),
    )
    try:
        result = configure_cdh(options)
    except CdhConfigError as exc:
        print(f"peerpods podvm cdh-config: {exc}; nothing written", file=sys.stderr)
        return 1
    print(f"peerpods podvm cdh-config: {result.note}", flush=True)
    return 0
