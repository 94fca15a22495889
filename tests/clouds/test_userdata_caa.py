"""Every user data the adaptor sends a pod VM is one CAA's process-user-data accepts: it reads
it strictly (tests.clouds.caa_userdata), and a refused document leaves the VM without apf.json
(no forwarder config, no warm request). Checked for a pod's VM with and without GPUs (its
devices files too) and for a warm pool's VM; and the check itself refuses what CAA refuses."""

from __future__ import annotations

import json

import pytest

from adaptor.planning.userdata import APF_PATH, DEVICES_PATH, GpuSetup, MigSlot, PodVMConfig, render
from adaptor.warmpool.userdata import warm_user_data
from tests.clouds.caa_userdata import caa_files


def test_a_pods_user_data_is_read_by_caa() -> None:
    files = caa_files(render(PodVMConfig(pod_namespace="default", pod_name="train")))
    assert json.loads(files[APF_PATH])["pod-name"] == "train"


def test_a_gpu_pods_user_data_is_read_by_caa() -> None:
    gpu = GpuSetup(model="h100", mig=((MigSlot("1g.10gb", 0),),))
    config = PodVMConfig(
        pod_namespace="default",
        pod_name="train",
        tls_server_key="-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n",
        gpu=gpu,
        extra_files=(("/run/peerpod/devices.a100.json", "{}"),),
    )
    files = caa_files(render(config))
    assert set(files) == {APF_PATH, DEVICES_PATH, "/run/peerpod/devices.a100.json"}
    assert json.loads(files[APF_PATH])["tls-server-key"].startswith("-----BEGIN")


def test_a_warm_vms_user_data_is_read_by_caa() -> None:
    files = caa_files(warm_user_data(["busybox", "nvcr.io/nvidia/pytorch:25.01-py3"]))
    assert json.loads(files[APF_PATH])["peerpods-warm"]["images"][0] == "busybox"


@pytest.mark.parametrize(
    "user_data",
    [
        "#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  permissions: '0600'\n"
        "  content: '{}'\n",
        "#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  content: '{}'\n"
        "runcmd:\n- [poweroff]\n",
    ],
)
def test_what_caa_refuses_is_refused(user_data: str) -> None:
    with pytest.raises(AssertionError, match="CAA refuses"):
        caa_files(user_data)
