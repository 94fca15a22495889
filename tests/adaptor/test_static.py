"""The static provider and the provider registry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adaptor.state import StateStore
from providers.clouds import registry
from providers.clouds.settings import AwsSettings
from providers.clouds.static import Endpoint, StaticProvider, parse_endpoint, parse_endpoints
from providers.core.base import Provider, VMSpec
from providers.core.errors import CapacityError, InvalidRequest


def spec(sandbox: str) -> VMSpec:
    return VMSpec(sandbox_id=sandbox, pod_namespace="ns", pod_name="p")


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("127.0.0.1:15150", Endpoint("127.0.0.1", 15150)),
        ("[::1]:9", Endpoint("::1", 9)),
        (" vm-1.example:80 ", Endpoint("vm-1.example", 80)),
    ],
)
def test_parse_endpoint(text: str, endpoint: Endpoint) -> None:
    assert parse_endpoint(text) == endpoint


@pytest.mark.parametrize("text", ["", "host", "host:", ":80", "h:0", "h:70000", "::1:80", "a b:1"])
def test_parse_endpoint_rejects(text: str) -> None:
    with pytest.raises(InvalidRequest, match="endpoint"):
        parse_endpoint(text)


def test_duplicate_endpoints_rejected() -> None:
    with pytest.raises(InvalidRequest, match="duplicate"):
        parse_endpoints("a:1,b:2,a:1")


async def test_one_sandbox_per_endpoint_released_on_delete() -> None:
    provider = StaticProvider(parse_endpoints("127.0.0.1:1,127.0.0.1:2"))
    assert isinstance(provider, Provider)
    first = await provider.create(spec("a"))
    assert (first.addresses, first.port) == (("127.0.0.1",), 1)
    assert await provider.create(spec("a")) == first  # a retried create gets the same VM
    second = await provider.create(spec("b"))
    assert second.port == 2
    with pytest.raises(CapacityError, match="in use"):
        await provider.create(spec("c"))
    assert {i.id for i in await provider.list_owned()} == {first.id, second.id}
    await provider.delete(first.id)
    assert (await provider.create(spec("c"))).port == 1


async def test_pool_survives_restart_through_state_store(tmp_path: Path) -> None:
    endpoints = parse_endpoints("127.0.0.1:1")
    store = await StateStore.open(tmp_path)
    await StaticProvider(endpoints, store).create(spec("a"))
    await store.close()
    store = await StateStore.open(tmp_path)
    provider = StaticProvider(endpoints, store)
    with pytest.raises(CapacityError):
        await provider.create(spec("b"))
    owned = await provider.list_owned()
    assert [i.tags["peerpods-sandbox"] for i in owned] == ["a"]
    await store.close()


def test_registry_builds_static_and_local() -> None:
    options = registry.ProviderOptions(static_endpoints=parse_endpoints("127.0.0.1:5"))
    assert registry.create("static", options).name == "static"
    assert registry.create("local", options).name == "local"


async def test_a_prepared_pool_keeps_its_leases_in_the_store_it_is_finished_over(
    tmp_path: Path,
) -> None:
    options = registry.ProviderOptions(static_endpoints=parse_endpoints("127.0.0.1:1"))
    prepared = registry.prepare("static", options)  # checked before any store exists
    assert (prepared.name, prepared.region) == ("static", "")
    store = await StateStore.open(tmp_path)
    try:
        await prepared.finish(store).create(spec("a"))
        assert await store.leases("static") == {"127.0.0.1:1": "a"}
    finally:
        await store.close()
    with pytest.raises(InvalidRequest, match="--static-endpoints"):
        registry.prepare("static", registry.ProviderOptions())


def test_registry_errors_are_clear() -> None:
    with pytest.raises(InvalidRequest, match="unknown provider 'nope'"):
        registry.create("nope", registry.ProviderOptions())
    with pytest.raises(InvalidRequest, match="--static-endpoints"):
        registry.create("static", registry.ProviderOptions())


def test_registry_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        registry.PROVIDERS, "aws", registry.Entry("tests.adaptor.needs_missing_sdk:X", "aws")
    )
    with pytest.raises(InvalidRequest, match=r"pip install 'peerpods\[aws\]'"):
        registry.load("aws")


def test_registry_hint_when_the_sdk_is_missing_at_build(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = AwsSettings(aws_region="us-east-1", pod_vm_image="ami-1")
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` fails as if not installed
    with pytest.raises(
        InvalidRequest, match=r"needs the boto3 package: pip install 'peerpods\[aws\]'"
    ):
        registry.create("aws", registry.ProviderOptions(settings=settings, owner_id="node-1"))


def test_registry_builds_a_cloud_provider_from_serve_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    from adaptor.cli import flags
    from adaptor.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "serve",
            "--provider",
            "aws",
            "--aws-region",
            "us-east-1",
            "--pod-vm-image",
            "ami-0a1b2c3d4e5f60718",
            "--aws-subnet-id",
            "subnet-0a1b2c3d",
            "--aws-security-group-ids",
            "sg-0a1b2c3d",
            "--no-agent-tls",
        ]
    )
    settings = flags.section(AwsSettings, args)
    assert settings.aws_zones == () and settings.aws_use_public_ip is False
    provider = registry.create(
        "aws", registry.ProviderOptions(settings=settings, owner_id="peerpods-node-1")
    )
    assert provider.name == "aws"
    assert getattr(provider, "owner_id", None) == "peerpods-node-1"
    with pytest.raises(InvalidRequest, match="serve"):
        registry.create("aws", registry.ProviderOptions())
