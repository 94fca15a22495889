"""Fixtures for the cloud lifecycle tests: moto's EC2 in process, a fast retry policy."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from providers.clouds.retry import RetryPolicy
from providers.core.base import Instance

FORWARDER = ("127.0.0.1", 15150)


def loopback(vm: Instance) -> Instance:
    """Every pod VM is dialled on loopback; its cloud address is kept in `extra`."""
    extra = {**vm.extra, "cloud_address": vm.addresses[0] if vm.addresses else ""}
    return replace(vm, addresses=(FORWARDER[0],), port=FORWARDER[1], extra=extra)


class Sleeps:
    """A policy.sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def policy(sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(rng=random.Random(7), sleep=sleeps)


@contextlib.contextmanager
def mocked_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's AWS in process, with test credentials in place of any the machine has."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with mocked_aws(monkeypatch):
        yield


@pytest.fixture
def ec2(aws_env: None) -> Any:
    from providers.clouds.aws import AwsConfig, make_client

    return make_client(AwsConfig(region="us-east-1"))
