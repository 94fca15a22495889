"""`peerpods serve` as its command line parses it (`--warm-pool` and every other flag through the
real parser), on the aws provider against a moto EC2 server; every pod VM's forwarder is
dialled at the test's pod VM agent on loopback, and no address off this host is ever dialled
(an audit hook refuses it). With FAULT `start`, EC2 answers every StartInstances with
InsufficientInstanceCapacity (tests.clouds.aws_faults), so no stopped VM can be started; with
`hold-start`, every StartInstances is held for a minute before it is sent (a kill -9 lands in
an adoption).

    python -m tests.peers.warm_kata_daemon MOTO_PORT AGENT_PORT FAULT SERVE_FLAGS...

The warm VMs' guests (their power-off once booted) are played by the test, outside this
process (tests.clouds.latency.Guests).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence

from adaptor.cli import flags
from adaptor.cli.main import build_parser
from adaptor.node.daemon import serve
from adaptor.node.settings import ServeSettings
from adaptor.runtime.logs import configure
from adaptor.settings import AgentTls
from providers.clouds.aws import AwsConfig, AwsProvider, make_client
from providers.core.base import Instance
from tests.adaptor.moto_daemon import IMAGE, _loopback_only
from tests.clouds.aws_faults import Faults

ZONE = "us-east-1a"
log = logging.getLogger("tests.peers.warm_kata_daemon")
FAULTS = ("none", "start", "hold-start")
HOLD_SECONDS = 60.0


def _no_capacity_to_start(action: str, _params: dict[str, str]) -> str | None:
    return "InsufficientInstanceCapacity" if action == "StartInstances" else None


def _hold_starts(action: str, _params: dict[str, str]) -> str | None:
    if action == "StartInstances":
        time.sleep(HOLD_SECONDS)  # in the SDK's worker thread, as a slow cloud call is
    return None


def provider(moto_port: int, owner: str, fault: str) -> AwsProvider:
    """The aws provider against moto, its client's StartInstances as `fault` says."""
    config = AwsConfig(
        region="us-east-1",
        image_id=IMAGE,
        zones=(ZONE,),
        endpoint_url=f"http://127.0.0.1:{moto_port}",
        poll_interval_seconds=0.05,
    )
    client = make_client(config)
    if fault == "start":
        Faults([_no_capacity_to_start]).install(client)
    elif fault == "hold-start":
        Faults([_hold_starts]).install(client)
    return AwsProvider(config, owner, client=client)


def main(moto_port: int, agent_port: int, fault: str, serve_flags: Sequence[str]) -> None:
    if fault not in FAULTS:
        raise SystemExit(f"FAULT must be one of {', '.join(FAULTS)}, not {fault!r}")
    sys.addaudithook(_loopback_only)
    args = build_parser().parse_args(["serve", *serve_flags])
    configure(args.log_level, args.log_format)
    # as adaptor.cli.serve.run builds them
    settings = flags.section(ServeSettings, args, agent_tls=flags.section(AgentTls, args))

    def resolve(instance: Instance) -> tuple[str, int]:
        # what the adaptor would have dialled, for the test to compare with the cloud's VM
        log.info("forwarder of %s at %s: dialled at the test's agent", instance.id,
                 ",".join(instance.addresses))  # fmt: skip
        return "127.0.0.1", agent_port

    cloud = provider(moto_port, settings.owner_id, fault)
    asyncio.run(serve(settings, provider=cloud, resolve_endpoint=resolve))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:])
