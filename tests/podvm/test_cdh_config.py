"""`peerpods podvm cdh-config`: with images in the store, a registries.conf whose mirrors are the
loopback mirror and a CDH configuration naming it (the operator's, extended in place, or CDH's
defaults); an operator's own registry configuration is kept; an empty store writes nothing.
Everything written is read back with tomllib as CDH and image-rs read TOML, and the mirror
locations are fetched from the real `peerpods podvm image-mirror`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import urllib3

from adaptor.cli.main import main
from adaptor.podvm.cdhconfig import MARK, registries_conf
from adaptor.podvm.imagecache.store import ImageStore
from tests.podvm.imagecache_peers import OCI_MANIFEST, mirror
from tests.podvm.warm_vm import Vm

OPERATOR = """\
# from initdata
socket = "unix:///run/confidential-containers/cdh.sock"

[kbc]
name = "cc_kbc"
url = "http://kbs.example:8080"

[[credentials]]
resource_uri = "kbs:///default/key/1"
path = "/run/confidential-containers/cdh/kbs/key"

[image]
max_concurrent_layer_downloads_per_image = 3   # ours
authenticated_registry_credentials_uri = "kbs:///default/credential/test"
"""


@pytest.fixture
def vm(tmp_path: Path) -> Vm:
    return Vm(tmp_path)


def mirrors_of(path: Path) -> dict[str, list[dict[str, object]]]:
    document = tomllib.loads(path.read_text())
    return {r["prefix"]: r["mirror"] for r in document["registry"]}


def test_without_an_operator_config_cdh_gets_its_defaults_and_the_mirror(vm: Vm) -> None:
    vm.put("docker.io", "library/busybox", "latest")
    vm.put("nvcr.io", "nvidia/pytorch", "25.01-py3")
    assert main(vm.cdh_argv()) == 0
    assert mirrors_of(vm.registries) == {
        "docker.io": [{"location": "127.0.0.1:5170/docker.io", "insecure": True}],
        "nvcr.io": [{"location": "127.0.0.1:5170/nvcr.io", "insecure": True}],
    }
    assert "location" not in tomllib.loads(vm.registries.read_text())["registry"][0]
    assert tomllib.loads(vm.cdh.read_text()) == {
        "kbc": {"name": "offline_fs_kbc", "url": ""},
        "image": {"registry_configuration_uri": vm.registries.as_uri()},
    }
    assert vm.cdh.stat().st_mode & 0o777 == 0o600


def test_the_operators_config_is_extended_in_place(vm: Vm) -> None:
    vm.put("ghcr.io", "team/app", "v1")
    vm.operator_config(OPERATOR)
    assert main(vm.cdh_argv()) == 0
    written = vm.cdh.read_text()
    expected = tomllib.loads(OPERATOR)
    expected["image"]["registry_configuration_uri"] = vm.registries.as_uri()
    assert tomllib.loads(written) == expected
    for line in OPERATOR.splitlines():  # every line of the operator's is still there
        assert line in written.splitlines()
    assert MARK in written
    assert vm.operator.read_text() == OPERATOR  # the operator's own file is not touched
    assert list(mirrors_of(vm.registries)) == ["ghcr.io"]


def test_an_operator_config_without_an_image_table_gets_one(vm: Vm) -> None:
    vm.put("docker.io", "library/busybox", "latest")
    vm.operator_config('[kbc]\nname = "offline_fs_kbc"\n')
    assert main(vm.cdh_argv()) == 0
    assert tomllib.loads(vm.cdh.read_text()) == {
        "kbc": {"name": "offline_fs_kbc"},
        "image": {"registry_configuration_uri": vm.registries.as_uri()},
    }


@pytest.mark.parametrize(
    "own",
    [
        'registry_configuration_uri = "kbs:///default/registry-configuration/test"',
        '[image.registry_config]\nunqualified-search-registries = ["docker.io"]',
        # a policy: image-rs would check a mirror pull under the mirror's name, out of its scopes
        'image_security_policy_uri = "kbs:///default/security-policy/test"',
        'image_security_policy = """{"default": [{"type": "reject"}]}"""',
    ],
)
def test_an_operators_own_registry_configuration_is_kept(
    vm: Vm, own: str, capsys: pytest.CaptureFixture[str]
) -> None:
    vm.put("docker.io", "library/busybox", "latest")
    vm.operator_config(f'[kbc]\nname = "offline_fs_kbc"\n\n[image]\n{own}\n')
    assert main(vm.cdh_argv()) == 0
    assert not vm.cdh.exists() and not vm.registries.exists()
    out, err = capsys.readouterr()
    logged = [json.loads(line) for line in err.splitlines()]
    assert [(r["level"], r["logger"]) for r in logged] == [("warning", "adaptor.podvm.cdhconfig")]
    assert ": kept, and the pre-pulled images of docker.io" in logged[0]["message"]
    assert "not offered to CDH" in out


def test_an_empty_store_writes_nothing(vm: Vm) -> None:
    assert main(vm.cdh_argv()) == 0
    assert not vm.store.exists()  # not even created
    ImageStore(vm.store)  # a store that never recorded an image
    vm.operator_config(OPERATOR)
    vm.cdh.parent.mkdir(parents=True)
    vm.cdh.write_text("stale")
    assert main(vm.cdh_argv()) == 0
    assert not vm.cdh.exists() and not vm.registries.exists()
    assert vm.operator.read_text() == OPERATOR


def test_an_operator_config_that_is_not_toml_writes_nothing(
    vm: Vm, capsys: pytest.CaptureFixture[str]
) -> None:
    vm.put("docker.io", "library/busybox", "latest")
    vm.operator_config("[kbc\nname = 1\n")
    assert main(vm.cdh_argv()) == 1
    assert not vm.cdh.exists() and not vm.registries.exists()
    err = capsys.readouterr().err
    assert "not TOML" in err and "nothing written" in err and "Traceback" not in err


def test_an_inline_image_table_cannot_be_extended_and_is_left_alone(vm: Vm) -> None:
    vm.put("docker.io", "library/busybox", "latest")
    vm.operator_config('kbc = { name = "offline_fs_kbc" }\nimage = { work_dir = "/run/x" }\n')
    assert main(vm.cdh_argv()) == 1
    assert not vm.cdh.exists()


def test_registries_conf_escapes_what_it_writes() -> None:
    text = registries_conf({'odd"name': 'loc"ation'})
    assert tomllib.loads(text)["registry"] == [
        {"prefix": 'odd"name', "mirror": [{"location": 'loc"ation', "insecure": True}]}
    ]


def test_each_mirror_location_is_served_by_the_image_mirror(vm: Vm) -> None:
    """What image-rs will ask for, `<location>/<repository>/manifests/<tag>` over plain HTTP,
    answered by `peerpods podvm image-mirror` from the store, a port in a registry's name too."""
    images = [
        ("docker.io", "library/busybox", "latest"),
        ("registry.example:5000", "team/app", "v1"),
    ]
    digests = {image: vm.put(*image) for image in images}
    with mirror(vm.store) as address:
        assert main(vm.cdh_argv("--mirror", address)) == 0
        mirrors = mirrors_of(vm.registries)
        http = urllib3.PoolManager()
        for (registry, repository, tag), digest in digests.items():
            location = mirrors[registry][0]["location"]
            url = f"http://{location}/{repository}/manifests/{tag}".replace(
                f"http://{address}/", f"http://{address}/v2/", 1
            )
            answer = http.request("GET", url, headers={"Accept": OCI_MANIFEST})
            assert answer.status == 200, (url, answer.data)
            assert answer.headers["Docker-Content-Digest"] == digest


@pytest.mark.parametrize("operator", [None, '[kbc]\nname = "offline_fs_kbc"\n'])
def test_image_settings_on_the_kernel_command_line_are_not_hidden(
    vm: Vm, operator: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """image-rs reads agent.* image settings from the kernel command line only while the CDH
    configuration has no [image] table: none is added over them."""
    vm.put("docker.io", "library/busybox", "latest")
    if operator is not None:
        vm.operator_config(operator)
    vm.cmdline.write_text("console=ttyS0 agent.https_proxy=http://10.0.0.1:3128\n")
    assert main(vm.cdh_argv()) == 0
    assert not vm.cdh.exists() and not vm.registries.exists()
    assert "kernel command line sets agent.https_proxy" in capsys.readouterr().out
    # with an [image] table of the operator's, the command line is not read anyway: extended
    vm.operator_config('[kbc]\nname = "offline_fs_kbc"\n\n[image]\n')
    assert main(vm.cdh_argv()) == 0
    assert tomllib.loads(vm.cdh.read_text())["image"] == {
        "registry_configuration_uri": vm.registries.as_uri()
    }
