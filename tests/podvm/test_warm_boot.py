"""`peerpods podvm warm`: a warm pool VM's boot pulls the listed images into the store on the
image's persistent partition and powers off once, whatever fails; a pod's boot does nothing.

The pull is the real `peerpods podvm pull-images` against Debian's distribution registry on
loopback (an image pushed there by skopeo); the power-off and cloud-init are small scripts that
record their calls; the mount table is a file written here (the store's partition cannot be
mounted in a test) except where the machine's own /proc/self/mountinfo is read."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import urllib3

from adaptor.cli.main import main
from adaptor.podvm.imagecache.store import ImageStore
from adaptor.podvm.warmboot import volatile_reason, warm
from adaptor.podvm.warmrequest import WARM_KEY
from adaptor.warmpool.userdata import warm_user_data
from tests.clouds.warm_userdata import warm_request
from tests.podvm.imagecache_peers import (
    OCI_INDEX,
    OCI_MANIFEST,
    Pushed,
    mirror,
    need,
    push,
    registry,
    stop,
)
from tests.podvm.warm_vm import PULL, Vm

CLEANED = ["status --wait", "clean --logs"]  # cloud-init done, then its state cleaned


@pytest.fixture
def vm(tmp_path: Path) -> Vm:
    return Vm(tmp_path)


@pytest.fixture
def pushed(tmp_path: Path) -> Iterator[Pushed]:
    """An image of two platforms pushed by skopeo to Debian's registry on loopback."""
    need("docker-registry", "skopeo")
    with registry(tmp_path / "registry") as reg:
        yield push(tmp_path, reg)


def test_a_warm_boot_pulls_the_listed_images_and_powers_off_once(
    vm: Vm, pushed: Pushed, capsys: pytest.CaptureFixture[str]
) -> None:
    reg, image = pushed.registry, pushed.image
    # the apf.json the keeper's user data carries, as the VM writes it
    vm.apf.parent.mkdir(parents=True)
    request = warm_request(warm_user_data([image]))
    vm.apf.write_text(json.dumps({WARM_KEY: request.to_dict()}))
    vm.on_partition()
    assert main(vm.warm_argv(pull=f"{PULL} --plain-http {reg.host}")) == 0
    assert vm.calls("poweroff") == [""]
    assert vm.calls("cloud-init") == CLEANED
    status = json.loads(vm.status.read_text())
    assert status["result"] == "ok" and status["images"] == {image: True}
    assert ImageStore(vm.store).resolve(reg.host, "team/app", "v1") is not None
    out = capsys.readouterr().out
    assert f"{image}: stored" in out and "powering off" in out


def test_a_pods_boot_does_nothing(vm: Vm) -> None:
    vm.apf.parent.mkdir(parents=True)
    vm.apf.write_text(json.dumps({"pod-name": "train", "pod-namespace": "default"}))
    vm.on_partition()
    assert main(vm.warm_argv(pull="false")) == 0
    assert vm.calls("poweroff") == [] and vm.calls("cloud-init") == []
    assert not vm.status.exists() and not vm.store.exists()


def test_no_apf_json_is_a_pods_boot_too(vm: Vm) -> None:
    assert main(vm.warm_argv(pull="false")) == 0
    assert vm.calls("poweroff") == []


def test_a_store_on_tmpfs_is_refused_and_the_vm_still_powers_off(
    vm: Vm, capsys: pytest.CaptureFixture[str]
) -> None:
    vm.request("busybox")
    # the partition is not mounted: the store would be on /var, a tmpfs
    vm.mounts(("/", "ro", "squashfs"), (str(vm.root), "rw,nosuid", "tmpfs"))
    pull_marker = vm.root / "pulled"
    assert main(vm.warm_argv(pull=f"touch {pull_marker}")) == 1
    assert not pull_marker.exists()
    assert vm.calls("poweroff") == [""] and vm.calls("cloud-init") == CLEANED
    status = json.loads(vm.status.read_text())
    assert "tmpfs" in status["storage_refused"] and status["images"] == {"busybox": False}
    err = capsys.readouterr().err
    assert "tmpfs" in err and "peerpods-images partition is not mounted" in err
    assert "Traceback" not in err


def test_a_failed_pull_is_reported_and_the_vm_still_powers_off(vm: Vm) -> None:
    vm.request("127.0.0.1:9/team/app:v1")  # nothing listens on the discard port
    vm.on_partition()
    assert main(vm.warm_argv("--pull-attempts", "1")) == 1
    assert vm.calls("poweroff") == [""] and vm.calls("cloud-init") == CLEANED
    status = json.loads(vm.status.read_text())
    assert status["pull_exit"] == 1 and status["images"] == {"127.0.0.1:9/team/app:v1": False}


def test_a_pull_past_its_deadline_is_stopped_and_the_vm_powers_off(vm: Vm) -> None:
    vm.request("busybox")
    vm.on_partition()
    assert main(vm.warm_argv("--pull-timeout", "1s", pull="sh -c 'sleep 30; :'")) == 1
    assert vm.calls("poweroff") == [""]
    status = json.loads(vm.status.read_text())
    assert status["pull_exit"] == 124 and "ran past" in status["errors"][0]


def test_a_malformed_request_is_a_warm_boot_that_pulls_nothing(vm: Vm) -> None:
    vm.apf.parent.mkdir(parents=True)
    vm.apf.write_text(json.dumps({WARM_KEY: {"v": 1, "images": "busybox"}}))
    vm.on_partition()
    assert main(vm.warm_argv(pull="false")) == 1
    assert vm.calls("poweroff") == [""]
    assert "peerpods-warm" in json.loads(vm.status.read_text())["errors"][0]


def test_an_unreadable_apf_json_is_bad_input_and_nothing_is_done(
    vm: Vm, capsys: pytest.CaptureFixture[str]
) -> None:
    vm.apf.parent.mkdir(parents=True)
    vm.apf.write_text("{not json")
    assert main(vm.warm_argv(pull="false")) == 2
    assert vm.calls("poweroff") == []
    err = capsys.readouterr().err
    assert "not JSON" in err and "Traceback" not in err


def test_without_cloud_init_nothing_is_cleaned(vm: Vm) -> None:
    vm.request()
    vm.on_partition()
    options = vm.warm_options(
        pull_command=("false",),
        poweroff_command=(str(vm.script("poweroff")),),
        cloud_init="peerpods-test-no-such-cloud-init",
    )
    result = warm(options, out=lambda _: None)
    assert result.warm and result.powered_off and not result.cloud_init_cleaned
    assert result.pull_exit is None  # no images: no pull
    assert vm.calls("poweroff") == [""] and vm.calls("cloud-init") == []


def test_a_poweroff_that_fails_is_reported(vm: Vm) -> None:
    vm.request()
    vm.on_partition()
    assert main([*vm.warm_argv(pull="false"), "--poweroff-command", "false"]) == 1
    assert vm.calls("cloud-init") == CLEANED


def test_the_store_s_file_system_is_read_from_the_mount_table(vm: Vm) -> None:
    spaced = vm.root / "with space" / "images"
    vm.mounts(
        ("/", "rw", "ext4"),
        (str(vm.root), "rw", "tmpfs"),
        (str(vm.root / "with space"), "rw", "xfs"),
        (str(vm.root / "ro"), "ro", "ext4"),
    )
    assert volatile_reason(spaced, vm.mountinfo) == ""  # the longest mount point holds it
    assert "tmpfs" in volatile_reason(vm.root / "other", vm.mountinfo)
    assert "read-only" in volatile_reason(vm.root / "ro" / "images", vm.mountinfo)
    # a persistent root (a cloud-init image's ext4) holds a store without its own partition
    assert volatile_reason(Path("/var/lib/peerpods/images"), vm.mountinfo) == ""
    # and this machine's own /dev/shm is a tmpfs
    assert "tmpfs" in volatile_reason(Path("/dev/shm/images"), Path("/proc/self/mountinfo"))


def test_the_adoption_boot_serves_what_the_warm_boot_pulled(vm: Vm, pushed: Pushed) -> None:
    """Warm boot, then the adoption's boot with the image's registry gone: `cdh-config` names the
    mirror for the registry, and what image-rs would ask there (the index by tag, the amd64
    manifest, its config and layers, plain HTTP) is answered from the store, byte for byte."""
    reg, layout = pushed.registry, pushed.layout
    vm.request(pushed.image)
    vm.on_partition()
    assert main(vm.warm_argv(pull=f"{PULL} --plain-http {reg.host}")) == 0
    stop(reg.process)  # the origin is gone: only the cache can answer
    with mirror(vm.store) as address:
        assert main(vm.cdh_argv("--mirror", address)) == 0
        conf = tomllib.loads(vm.registries.read_text())
        assert [r["prefix"] for r in conf["registry"]] == [reg.host]
        location = conf["registry"][0]["mirror"][0]["location"]
        assert conf["registry"][0]["mirror"][0]["insecure"] is True
        # image-rs's mirror task: the location, then what follows the prefix in the reference
        base = "http://" + location.replace(address, f"{address}/v2", 1) + "/team/app"
        http = urllib3.PoolManager()
        index = http.request("GET", f"{base}/manifests/{layout.tag}",
                             headers={"Accept": f"{OCI_INDEX}, {OCI_MANIFEST}"})  # fmt: skip
        assert index.status == 200 and index.data == layout.blob(layout.index_digest)
        amd64 = layout.manifests["linux/amd64"]
        manifest = http.request(
            "GET", f"{base}/manifests/{amd64}", headers={"Accept": OCI_MANIFEST}
        )
        assert manifest.status == 200 and manifest.data == layout.blob(amd64)
        for digest in [layout.configs["linux/amd64"], *layout.layers["linux/amd64"]]:
            blob = http.request("GET", f"{base}/blobs/{digest}")
            assert blob.status == 200 and blob.data == layout.blob(digest)


def test_the_pull_gets_the_store_the_credentials_and_the_images_in_order(vm: Vm) -> None:
    vm.request("busybox", "-not-a-flag")
    vm.on_partition()
    auth = vm.root / "run/peerpod/auth.json"
    auth.write_text("{}")
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout: float | None) -> int:
        calls.append(list(argv))
        return 0

    options = vm.warm_options(cloud_init=str(vm.script("cloud-init")), auth=auth)
    result = warm(options, runner=runner, out=lambda _: None)
    assert calls[0] == [
        *("pull-images", "--store", str(vm.store), "--auth", str(auth)),
        *("--", "busybox", "-not-a-flag"),  # an image is never read as a flag
    ]
    # then cloud-init, done and cleaned, and the power-off last
    assert [c[1:] for c in calls[1:3]] == [["status", "--wait"], ["clean", "--logs"]]
    assert calls[3:] == [["poweroff-now"]]
    assert result.powered_off and result.cloud_init_cleaned
    auth.unlink()  # no credentials file: no --auth
    calls.clear()
    warm(options, runner=runner, out=lambda _: None)
    assert "--auth" not in calls[0]


def test_a_failed_pull_is_tried_again_while_the_deadline_allows(vm: Vm) -> None:
    vm.request("busybox")
    vm.on_partition()
    statuses = iter([1, 0])
    pulls: list[float | None] = []
    pauses: list[float] = []

    def runner(argv: Sequence[str], timeout: float | None) -> int:
        if argv[0] == "pull-images":
            pulls.append(timeout)
            return next(statuses)
        return 0

    options = vm.warm_options(pull_timeout_seconds=100, sleep=pauses.append)
    result = warm(options, runner=runner, out=lambda _: None)
    assert result.pull_exit == 0 and len(pulls) == 2 and pauses == [15.0]
    assert pulls[1] is not None and pulls[1] <= 100  # the second try has what is left
    # bad input is not tried again, and the tries stop at pull_attempts
    for first, expected in ((2, 1), (1, 3)):
        statuses = iter([first] * 5)
        pulls.clear()
        assert warm(options, runner=runner, out=lambda _: None).pull_exit == first
        assert len(pulls) == expected
