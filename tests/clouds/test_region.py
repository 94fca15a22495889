"""Which region `serve` runs in, with the node's instance metadata (a fake service on loopback)
naming eu-west-1: the node's region wins over a default (the AWS SDK's AWS_REGION, or the
shipped ConfigMap, which sets none); a region the operator set that is not the node's is an
error naming both, not pod VMs launched in one region with the other's subnet. Azure alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from adaptor.cli import flags
from adaptor.cli.main import build_parser, main
from providers.clouds import registry
from providers.clouds.metadata import complete_aws, complete_azure
from providers.clouds.settings import AwsSettings, AzureSettings
from providers.core.errors import InvalidRequest
from tests.clouds.fake_metadata import fake_metadata

CONFIGMAP = Path(__file__).resolve().parents[2] / "config" / "deploy" / "adaptor" / "config.yaml"


@pytest.fixture(autouse=True)
def _metadata_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)


def _shipped_env() -> dict[str, str]:
    (config,) = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    return {str(k): str(v) for k, v in config["data"].items()}


def _aws_settings(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> AwsSettings:
    """The aws section `serve` builds with `environ` as its environment (the flags' twins)."""
    for name in [k for k in os.environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return flags.section(AwsSettings, build_parser().parse_args(["serve"]))


def test_the_shipped_configmap_leaves_the_region_to_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("boto3")
    with fake_metadata("aws") as imds:
        environ = {**_shipped_env(), "PEERPODS_POD_VM_IMAGE": "ami-1",
                   "PEERPODS_INSTANCE_METADATA_URL": imds.url}  # fmt: skip
        settings = complete_aws(_aws_settings(environ, monkeypatch))
    # one region for all: the node's subnet is in the node's region
    assert settings.aws_region == "eu-west-1"
    assert settings.aws_subnet_id == ("subnet-0a1b2c3d",)


def test_the_nodes_region_wins_over_the_sdks_default(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with fake_metadata("aws") as imds:
        settings = AwsSettings(pod_vm_image="ami-1", instance_metadata_url=imds.url)
        provider = registry.create(
            "aws", registry.ProviderOptions(settings=settings, owner_id="node-1")
        )
    assert provider.config.region == "eu-west-1"  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["env", "flag"])
def test_an_explicit_region_elsewhere_is_an_error_naming_both(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("boto3")
    for name in [k for k in os.environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(name)
    with fake_metadata("aws") as imds:
        region = ["--aws-region", "us-east-1"] if how == "flag" else []
        if how == "env":
            monkeypatch.setenv("PEERPODS_AWS_REGION", "us-east-1")
        code = main([
            "serve", "--provider", "aws", "--pod-vm-image", "ami-1", *region,
            "--instance-metadata-url", imds.url, "--state-dir", f"{tmp_path}/state",
            "--socket", f"{tmp_path}/hv.sock", "--pods-dir", f"{tmp_path}/pods",
            "--no-agent-tls", "--status-address", "",
        ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("peerpods serve: aws provider: the region")
    assert "set to us-east-1" in err and "this node is in eu-west-1" in err
    assert not (tmp_path / "state").exists()


def test_an_explicit_region_that_is_the_nodes_is_kept() -> None:
    with fake_metadata("aws") as imds:
        settings = AwsSettings(
            pod_vm_image="ami-1", instance_metadata_url=imds.url, aws_region="eu-west-1"
        )
        filled = complete_aws(settings)
    assert (filled.aws_region, filled.aws_subnet_id) == ("eu-west-1", ("subnet-0a1b2c3d",))


def test_an_explicit_region_with_its_own_network_is_not_asked_about() -> None:
    with fake_metadata("aws") as imds:
        settings = AwsSettings(
            pod_vm_image="ami-1", instance_metadata_url=imds.url, aws_region="us-east-1",
            aws_subnet_id=("subnet-1",), aws_security_group_ids=("sg-1",),
        )  # fmt: skip
        assert complete_aws(settings) is settings
    assert imds.requests == []


def test_azure_location_elsewhere_is_an_error_naming_both() -> None:
    with fake_metadata("azure") as imds:
        base = AzureSettings(pod_vm_image="img", instance_metadata_url=imds.url,
                             azure_subnet_id="/subscriptions/s/x/subnets/n")  # fmt: skip
        with pytest.raises(InvalidRequest) as refused:
            complete_azure(base.model_copy(update={"azure_region": "eastus"}))
        assert "set to eastus" in str(refused.value)
        assert "this node is in westeurope" in str(refused.value)
        same = complete_azure(base.model_copy(update={"azure_region": "West Europe"}))
        assert same.azure_region == "West Europe" and same.azure_subscription_id == "sub-1"
        assert complete_azure(base).azure_region == "westeurope"
