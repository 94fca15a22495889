"""Root disk sizes for the large CUDA images pod VMs pull: AWS resizes the AMI's own root device
(gp3, deleted with the VM; moto's EC2), Azure sizes the OS disk in the VM body it sends, GCP the
boot disk; 0 keeps the image's own on AWS and Azure."""

from __future__ import annotations

from typing import Any

from providers.clouds import aws, azure, gcp
from providers.clouds.retry import RetryPolicy
from providers.clouds.settings import AwsSettings, AzureSettings, GcpSettings
from tests.clouds.test_aws import live, provider, spec


async def test_aws_resizes_the_amis_root_volume(ec2: Any, policy: RetryPolicy) -> None:
    found = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "root-device-type",
                                "Values": ["ebs"]}])["Images"][0]  # fmt: skip
    p = provider(ec2, policy, image_id=found["ImageId"], root_volume_gib=200)
    vm = await p.create(spec())
    (instance,) = [i for i in live(ec2) if i["InstanceId"] == vm.id]
    (mapping,) = [
        m for m in instance["BlockDeviceMappings"] if m["DeviceName"] == found["RootDeviceName"]
    ]
    volume = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"][0]
    assert (volume["Size"], volume["VolumeType"]) == (200, "gp3")
    # the image is asked once, not at every create
    await p.create(spec(2))
    assert list(p._root_devices) == [found["ImageId"]]


def test_the_sizes_come_from_the_settings() -> None:
    assert (
        aws.config_from_settings(
            AwsSettings(aws_region="us-east-1", aws_root_volume_gib=150)
        ).root_volume_gib
        == 150
    )
    assert aws.config_from_settings(AwsSettings(aws_region="us-east-1")).root_volume_gib == 0
    assert azure.config_from_settings(AzureSettings(azure_os_disk_gib=256)).os_disk_gib == 256
    assert gcp.config_from_settings(GcpSettings(gcp_disk_gib=300)).disk_size_gb == 300
    assert gcp.config_from_settings(GcpSettings()).disk_size_gb == 20


async def test_azure_sizes_the_os_disk_in_the_vm_body(policy: RetryPolicy) -> None:
    from tests.clouds.fake_arm import VMS, FakeArm
    from tests.clouds.test_azure import provider as azure_provider
    from tests.clouds.test_azure import spec as azure_spec

    arm = FakeArm()
    await azure_provider(arm, policy, os_disk_gib=256).create(azure_spec(1))
    await azure_provider(arm, policy).create(azure_spec(2))
    sized, default = (p.json()["properties"]["storageProfile"]["osDisk"]
                      for p in arm.cloud.seen("PUT", VMS + r"/[^/]+"))  # fmt: skip
    assert sized["diskSizeGB"] == 256
    assert "diskSizeGB" not in default  # the image's own size
