"""Cloud networking from the node's instance metadata when unset, against fake metadata
services on loopback: AWS through IMDSv2 only (token first), Azure IMDS, GCP's metadata server;
what is set is never replaced; a provider that still lacks its subnet or security groups refuses
to start with the reason; proxies of the environment are never used."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from adaptor.cli.main import main
from providers.clouds import registry
from providers.clouds.metadata import (
    MetadataUnavailable,
    aws_node,
    complete_aws,
    complete_azure,
    complete_gcp,
    gcp_node,
)
from providers.clouds.settings import AwsSettings, AzureSettings, GcpSettings
from providers.core.errors import InvalidRequest
from tests.clouds.fake_metadata import fake_metadata


@pytest.fixture(autouse=True)
def _metadata_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy in the environment that answers nothing: the link-local metadata service must
    never be asked through it."""
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def closed_url() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening


@pytest.mark.usefixtures("proxied")
def test_imdsv2_token_first_then_every_read_carries_it() -> None:
    with fake_metadata("aws") as imds:
        node = aws_node(imds.url)
    assert (node.region, node.subnet_id, node.vpc_id) == (
        "eu-west-1",
        "subnet-0a1b2c3d",
        "vpc-0123",
    )
    assert node.security_group_ids == ("sg-0node", "sg-0peerpods")
    method, path, _ = imds.requests[0]
    assert (method, path) == ("PUT", "/latest/api/token")
    assert all(h.get("x-aws-ec2-metadata-token") == imds.token for _, _, h in imds.requests[1:])


def test_unset_aws_networking_comes_from_imds_and_set_values_stay() -> None:
    with fake_metadata("aws") as imds:
        bare = AwsSettings(pod_vm_image="ami-1", instance_metadata_url=imds.url)
        filled = complete_aws(bare)
        assert filled.aws_region == "eu-west-1"
        assert filled.aws_subnet_id == ("subnet-0a1b2c3d",)
        assert filled.aws_security_group_ids == ("sg-0node", "sg-0peerpods")
        mine = AwsSettings(pod_vm_image="ami-1", instance_metadata_url=imds.url,
                           aws_region="eu-west-1", aws_subnet_id=("subnet-mine",))  # fmt: skip
        kept = complete_aws(mine)
        assert kept.aws_region == "eu-west-1" and kept.aws_subnet_id == ("subnet-mine",)
        assert kept.aws_security_group_ids == ("sg-0node", "sg-0peerpods")
        asked = len(imds.requests)
        full = mine.model_copy(update={"aws_security_group_ids": ("sg-1",)})
        assert complete_aws(full) is full and len(imds.requests) == asked  # nothing asked


def test_the_aws_provider_is_built_on_the_nodes_network(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with fake_metadata("aws") as imds:
        settings = AwsSettings(pod_vm_image="ami-1", instance_metadata_url=imds.url)
        provider = registry.create(
            "aws", registry.ProviderOptions(settings=settings, owner_id="node-1")
        )
    config = provider.config  # type: ignore[attr-defined]
    assert (config.region, config.subnet_ids) == ("eu-west-1", ("subnet-0a1b2c3d",))
    assert config.security_group_ids == ("sg-0node", "sg-0peerpods")


def test_aws_refuses_to_start_without_a_subnet_it_cannot_learn(closed_url: str) -> None:
    settings = AwsSettings(pod_vm_image="ami-1", aws_region="us-east-1",
                           instance_metadata_url=closed_url)  # fmt: skip
    with pytest.raises(InvalidRequest) as refused:
        complete_aws(settings)
    message = str(refused.value)
    assert message.startswith("aws provider: no --aws-subnet-id, --aws-security-group-ids")
    assert "IMDSv2" in message and "did not answer" in message
    off = settings.model_copy(update={"instance_metadata": False})
    with pytest.raises(InvalidRequest, match="metadata service is off"):
        complete_aws(off)


def test_imds_without_a_token_is_refused_by_the_fake_too() -> None:
    with fake_metadata("aws") as imds:
        import urllib.request

        request = urllib.request.Request(f"{imds.url}/latest/meta-data/mac")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=2)
        assert refused.value.code == 401  # an IMDSv1 read would be a real instance's 401 too


def test_azure_identity_from_imds_and_the_subnet_stays_required() -> None:
    with fake_metadata("azure") as imds:
        subnet = "/subscriptions/sub-1/resourceGroups/net/providers/x/subnets/nodes"
        settings = AzureSettings(
            pod_vm_image="img", instance_metadata_url=imds.url, azure_subnet_id=subnet
        )
        filled = complete_azure(settings)
        assert (filled.azure_subscription_id, filled.azure_resource_group,
                filled.azure_region) == ("sub-1", "rg-nodes", "westeurope")  # fmt: skip
        assert imds.requests[0][2].get("metadata") == "true"
        with pytest.raises(InvalidRequest, match="does not name the node's subnet"):
            complete_azure(settings.model_copy(update={"azure_subnet_id": ""}))


def test_azure_refuses_without_imds(closed_url: str) -> None:
    settings = AzureSettings(
        pod_vm_image="img", azure_subnet_id="s", instance_metadata_url=closed_url
    )
    with pytest.raises(InvalidRequest, match="no --azure-subscription-id, --azure-resource-group"):
        complete_azure(settings)


def test_azure_without_imds_or_subnet_names_the_subnet_flag_too(closed_url: str) -> None:
    # every flag the operator must give, in one line: the subnet never comes from metadata
    settings = AzureSettings(pod_vm_image="img", instance_metadata_url=closed_url)
    with pytest.raises(InvalidRequest) as caught:
        complete_azure(settings)
    message = str(caught.value)
    assert "--azure-subscription-id, --azure-resource-group, --azure-region" in message
    assert message.endswith("; and no --azure-subnet-id, which it never gives")


@pytest.mark.usefixtures("proxied")
def test_gcp_project_zone_and_network_from_the_metadata_server() -> None:
    with fake_metadata("gcp") as server:
        node = gcp_node(server.url)
        assert (node.project, node.zone, node.network) == (
            "my-project",
            "europe-west4-a",
            "gpu-vpc",
        )
        settings = GcpSettings(pod_vm_image="img", instance_metadata_url=server.url,
                               gcp_network="mine")  # fmt: skip
        filled = complete_gcp(settings)
    assert filled.gcp_project == "my-project" and filled.gcp_zones == ("europe-west4-a",)
    assert filled.gcp_network == "mine"
    assert all(h.get("metadata-flavor") == "Google" for _, _, h in server.requests)


def test_gcp_refuses_without_project_or_zones(closed_url: str) -> None:
    with pytest.raises(InvalidRequest, match="--gcp-project and --gcp-zones are required"):
        complete_gcp(GcpSettings(pod_vm_image="img", instance_metadata_url=closed_url))


def test_a_wrong_answer_is_unavailable_not_a_crash() -> None:
    with fake_metadata("azure") as imds:
        imds.azure = {"unexpected": True}  # type: ignore[assignment]
        from providers.clouds.metadata import azure_node

        with pytest.raises(MetadataUnavailable, match="not an instance's compute metadata"):
            azure_node(imds.url)


def test_serve_refuses_with_one_line(closed_url: str, tmp_path: object,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code = main([
        "serve", "--provider", "aws", "--aws-region", "us-east-1", "--pod-vm-image", "ami-1",
        "--instance-metadata-url", closed_url, "--state-dir", f"{tmp_path}/state",
        "--socket", f"{tmp_path}/hv.sock", "--pods-dir", f"{tmp_path}/pods", "--no-agent-tls",
        "--status-address", "",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        err.startswith("peerpods serve: aws provider: no --aws-subnet-id") and err.count("\n") == 1
    )
