"""The warm pool's settings: `--warm-pool` given several times or comma-separated, its env twin,
the caps, and clear refusals of bad pools; a provider that cannot stop VMs is refused at start."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest

from adaptor.cli import flags, serve
from adaptor.node.daemon import Daemon
from adaptor.node.settings import ServeSettings
from adaptor.warmpool import Pool, WarmConfig
from providers.core.errors import InvalidRequest


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ServeSettings:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(argv)
    flags.resolve(args, environ or {})
    return flags.section(ServeSettings, args, agent_tls={"enabled": False})


def test_the_flag_repeats_and_takes_commas() -> None:
    settings = parse(
        ["--warm-pool", "p5.4xlarge=2@us-east-1a", "--warm-pool", "m5.large=1,g6.xlarge=3"]
    )
    assert settings.warm_pools == ("p5.4xlarge=2@us-east-1a", "m5.large=1", "g6.xlarge=3")
    config = WarmConfig.of(settings, ("us-east-1b", "us-east-1c"))
    assert config.pools == (
        Pool("p5.4xlarge", 2, "us-east-1a"),
        Pool("m5.large", 1, "us-east-1b"),  # no zone: the provider's first
        Pool("g6.xlarge", 3, "us-east-1b"),
    )


def test_the_env_twins() -> None:
    environ = {
        "PEERPODS_WARM_POOL": "m5.large=2",
        "PEERPODS_WARM_POOL_IMAGE": "nvcr.io/nvidia/pytorch:25.01-py3,busybox",
        "PEERPODS_WARM_POOL_MAX_VMS": "4",
        "PEERPODS_WARM_POOL_MAX_COST_PER_HOUR": "1.5",
        "PEERPODS_WARM_POOL_DRAIN_ON_EXIT": "true",
    }
    settings = parse([], environ)
    assert settings.warm_pools == ("m5.large=2",)
    assert settings.warm_pool_images == ("nvcr.io/nvidia/pytorch:25.01-py3", "busybox")
    assert settings.warm_pool_max_vms == 4 and settings.warm_pool_max_cost_per_hour == 1.5
    assert settings.warm_pool_drain_on_exit


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("m5.large", "invalid warm pool 'm5.large' (write TYPE=N or TYPE=N@ZONE)"),
        ("m5.large=-1", "invalid warm pool"),
        ("m5.large=101", "at most 100 VMs per pool"),
        ("m5.large=1,m5.large=2", "warm pool m5.large@(default zone) is given twice"),
    ],
)
def test_bad_pools_are_refused_naming_the_flag(value: str, said: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse([], {"PEERPODS_WARM_POOL": value})
    assert "PEERPODS_WARM_POOL" in str(refused.value) and said in str(refused.value)
    with pytest.raises(InvalidRequest, match="warm_pools"):
        ServeSettings.build(warm_pools=(value,))


async def test_a_provider_that_cannot_stop_vms_is_refused_at_start() -> None:
    with tempfile.TemporaryDirectory(prefix="pw", dir="/tmp") as directory:
        root = Path(directory)
        settings = ServeSettings.build(
            socket=root / "hv.sock",
            pods_dir=root / "p",
            state_dir=root / "state",
            agent_tls={"enabled": False},
            status_address="",
            static_endpoints="127.0.0.1:15150",
            warm_pools=("m5.large=1",),
        )
        daemon = Daemon(settings)
        with pytest.raises(InvalidRequest, match="the static provider cannot keep stopped VMs"):
            await daemon.start()
        assert not (root / "hv.sock").exists()
