"""`peerpods node install|uninstall` against Debian's real containerd: the drop-in it writes is
loaded by containerd (its CRI plugin lists the kata-remote runtime with our Kata configuration,
and still the default runtime), a second install changes nothing, uninstall puts every byte
back, and a refusal writes nothing."""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from adaptor.cli.main import main
from adaptor.node.install import (
    InstallError,
    NodeInstall,
    containerd_dropin,
    install,
    kata_configuration,
    uninstall,
)
from tests.node import containerd
from tests.node.containerd import default_config, private, running

needs_containerd = pytest.mark.skipif(
    not containerd.available() and not os.environ.get("CI"),
    reason="needs Debian's containerd (tests/run installs it)",
)


def settings_in(base: Path, **extra: object) -> NodeInstall:
    """An install whose every host path lies under `base` (host root /, so containerd, run
    here, reads the same paths the installer wrote)."""
    fields: dict[str, object] = {
        "containerd_config": f"{base}/etc/containerd/config.toml",
        "dropin": f"{base}/etc/containerd/conf.d/50-peerpods-kata-remote.toml",
        "kata_config": f"{base}/opt/peerpods/share/kata/configuration-remote.toml",
        "record": f"{base}/var/lib/peerpods/node-install.json",
        **extra,
    }
    return NodeInstall.build(**fields)


def tree(base: Path) -> dict[str, bytes | None]:
    """Every path under `base` with its content (None for directories), containerd's own state
    left out."""
    found: dict[str, bytes | None] = {}
    for path in sorted(base.rglob("*")):
        name = str(path.relative_to(base))
        if name.split("/")[0] in ("root", "state", "c.sock", "containerd.log"):
            continue
        found[name] = None if path.is_dir() else path.read_bytes()
    return found


@pytest.fixture
def base() -> Iterator[Path]:
    # Short: containerd's socket paths must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="ppn", dir="/tmp") as directory:
        (Path(directory) / "etc" / "containerd").mkdir(parents=True)
        yield Path(directory)


def _runtimes(config: dict[str, object]) -> dict[str, dict[str, object]]:
    return config["containerd"]["runtimes"]  # type: ignore[index,no-any-return]


@needs_containerd
def test_containerd_loads_the_dropin_and_lists_kata_remote(base: Path) -> None:
    settings = settings_in(base)
    main_config = base / "etc/containerd/config.toml"
    main_config.write_text(default_config(base))  # containerd 1.x: imports = [], version 2
    outcome = install(settings)
    assert str(settings.dropin) in outcome.written and outcome.containerd_changed

    with running(main_config, base) as daemon:
        plugins = daemon.plugins()
        assert any(
            line.split()[1] == "cri" and line.split()[-1] == "ok"
            for line in plugins.splitlines()[1:]
        ), plugins
        config = daemon.cri_config()
    # the guest pull's snapshotter is declared to containerd (it dials it when first used)
    assert any(
        line.split()[:2] == ["io.containerd.snapshotter.v1", "nydus"] and line.split()[-1] == "ok"
        for line in plugins.splitlines()
    ), plugins
    runtimes = _runtimes(config)
    assert set(runtimes) == {"runc", "kata-remote"}, runtimes
    kata = runtimes["kata-remote"]
    assert kata["runtimeType"] == "io.containerd.kata.v2"
    assert kata["PodAnnotations"] == ["io.katacontainers.*"]
    assert kata["options"] == {"ConfigPath": str(settings.kata_config)}
    assert config["containerd"]["disableSnapshotAnnotations"] is False  # type: ignore[index]
    # the main file's own CRI settings survive the section the drop-in replaces
    assert config["containerd"]["snapshotter"] == "native"  # type: ignore[index]

    kata_config = tomllib.loads(Path(settings.kata_config).read_text())
    remote = kata_config["hypervisor"]["remote"]
    assert remote["remote_hypervisor_socket"] == "/run/peerpod/hypervisor.sock"
    assert "default_gpu_model" in remote["enable_annotations"]
    assert kata_config["runtime"]["internetworking_model"] == "none"


@needs_containerd
def test_a_main_file_without_a_cri_section_keeps_its_default_runtime(base: Path) -> None:
    settings = settings_in(base, snapshotter="")
    main_config = base / "etc/containerd/config.toml"
    before = private(
        'version = 2\nroot = "/var/lib/containerd"\nstate = "/run/containerd"\n\n[grpc]\n'
        '  address = "/run/containerd/containerd.sock"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n',
        base,
    )
    main_config.write_text(before)
    install(settings)
    text = main_config.read_text()
    assert text.endswith(before) and text.startswith("imports = [")
    with running(main_config, base) as daemon:
        runtimes = _runtimes(daemon.cri_config())
    assert set(runtimes) == {"runc", "kata-remote"}
    assert (
        "snapshotter"
        not in tomllib.loads(Path(settings.dropin).read_text())["plugins"][
            "io.containerd.grpc.v1.cri"
        ]["containerd"]["runtimes"]["kata-remote"]
    )


def test_the_version_3_dropin_holds_only_the_runtime(base: Path) -> None:
    settings = settings_in(base)
    main_config = base / "etc/containerd/config.toml"
    main_config.write_text(
        "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n\n"
        "[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n"
    )
    install(settings)
    dropin = tomllib.loads(Path(settings.dropin).read_text())
    assert dropin == {
        "version": 3,
        "proxy_plugins": {
            "nydus": {
                "type": "snapshot",
                "address": "/run/containerd-nydus/containerd-nydus-grpc.sock",
            }
        },
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {
                    "runtimes": {
                        "kata-remote": {
                            "runtime_type": "io.containerd.kata.v2",
                            "runtime_path": "/opt/kata/bin/containerd-shim-kata-v2",
                            "pod_annotations": ["io.katacontainers.*"],
                            "privileged_without_host_devices": True,
                            "snapshotter": "nydus",
                            "options": {"ConfigPath": str(settings.kata_config)},
                        }
                    }
                }
            }
        },
    }


def test_install_is_idempotent_and_uninstall_restores_every_byte(base: Path) -> None:
    settings = settings_in(base)
    main_config = base / "etc/containerd/config.toml"
    main_config.write_text('version = 2\nimports = ["/etc/other.toml"]\n\n[grpc]\n  uid = 0\n')
    (base / "opt").mkdir()  # was there before: must stay
    before = tree(base)

    first = install(settings)
    assert sorted(first.written) == sorted(
        [str(settings.kata_config), str(settings.dropin), str(settings.containerd_config)]
    )
    assert tomllib.loads(main_config.read_text())["imports"] == [
        "/etc/other.toml", str(settings.dropin)
    ]  # fmt: skip
    installed = tree(base)
    second = install(settings)
    assert second.written == [] and not second.containerd_changed
    assert tree(base) == installed

    done = uninstall(settings)
    assert done.kept == [] and done.containerd_changed
    assert tree(base) == before
    assert uninstall(settings).removed == []  # nothing left to remove


def test_uninstall_leaves_a_file_someone_changed(base: Path) -> None:
    settings = settings_in(base)
    (base / "etc/containerd/config.toml").write_text("version = 2\n")
    install(settings)
    kata = Path(settings.kata_config)
    kata.write_text(kata.read_text() + "# tuned by hand\n")
    done = uninstall(settings)
    assert done.kept[0] == str(settings.kata_config) and kata.exists()
    assert not Path(settings.dropin).exists()
    assert (base / "etc/containerd/config.toml").read_text() == "version = 2\n"


def test_a_glob_import_that_covers_the_dropin_leaves_the_main_file_alone(base: Path) -> None:
    settings = settings_in(base)
    text = f'version = 2\nimports = ["{base}/etc/containerd/conf.d/*.toml"]\n'
    (base / "etc/containerd/config.toml").write_text(text)
    outcome = install(settings)
    assert str(settings.containerd_config) not in outcome.written
    assert (base / "etc/containerd/config.toml").read_text() == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('root = "/var/lib/containerd"\n', "config version 1 is not supported"),
        ("version = 2\nimports = [\n  '/a.toml',\n]\n", "imports span several lines"),
        ("version = 2\n[[[\n", "not TOML"),
        ("version = 2\nimports = 'x'\n", "imports is not a list"),
        (None, "not found"),
    ],
)
def test_refusals_change_nothing(base: Path, text: str | None, message: str) -> None:
    settings = settings_in(base)
    if text is not None:
        (base / "etc/containerd/config.toml").write_text(text)
    before = tree(base)
    with pytest.raises(InstallError, match=message):
        install(settings)
    assert tree(base) == before


def test_bad_settings_are_named() -> None:
    with pytest.raises(InstallError, match="handler"):
        NodeInstall.build(handler="Kata_Remote")
    with pytest.raises(InstallError, match="absolute host path"):
        NodeInstall.build(dropin="conf.d/x.toml")
    with pytest.raises(InstallError, match="absolute host path"):
        NodeInstall.build(record="/var/lib/../../etc/passwd")


def test_the_cli_installs_restarts_once_and_uninstalls(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (base / "etc/containerd/config.toml").write_text("version = 2\n")
    restarted = base / "restarted"
    args = [
        "node", "install",
        "--containerd-config", f"{base}/etc/containerd/config.toml",
        "--containerd-dropin", f"{base}/etc/containerd/conf.d/peerpods.toml",
        "--kata-config", f"{base}/kata/configuration-remote.toml",
        "--install-record", f"{base}/record.json",
        "--restart-command", f"touch {restarted}",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"wrote {base}/etc/containerd/conf.d/peerpods.toml" in out
    assert restarted.exists()
    restarted.unlink()
    assert main(args) == 0
    assert "nothing to change" in capsys.readouterr().out
    assert not restarted.exists()  # nothing changed: nothing restarted
    args[1] = "uninstall"
    assert main(args) == 0
    assert f"removed {base}/kata/configuration-remote.toml" in capsys.readouterr().out
    assert restarted.exists()
    assert (base / "etc/containerd/config.toml").read_text() == "version = 2\n"

    assert main([*args[:2], "--handler", "Bad Name"]) == 2
    assert "peerpods node: handler:" in capsys.readouterr().err


def test_paths_are_the_hosts_under_host_root(base: Path) -> None:
    settings = NodeInstall.build(host_root=base)
    assert settings.host(PurePosixPath("/etc/containerd/config.toml")) == (
        base / "etc/containerd/config.toml"
    )
    (base / "etc/containerd/config.toml").write_text("version = 3\n")
    install(settings)
    assert (base / "etc/containerd/conf.d/50-peerpods-kata-remote.toml").is_file()
    # the file names the host's paths, not the installer's
    assert (
        "/opt/peerpods/share/kata/configuration-remote.toml"
        in (base / "etc/containerd/conf.d/50-peerpods-kata-remote.toml").read_text()
    )
    assert str(base) not in (base / "etc/containerd/config.toml").read_text()


def test_the_installer_daemonset_mounts_every_path_it_writes() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2] / "config" / "deploy"
    (daemonset,) = yaml.safe_load_all((root / "node" / "installer.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:2] == ["node", "install"] and "--wait" in container["args"]
    assert "--host-root=/host" in container["args"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounted = {
        m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]
    }  # container path -> host path
    for mount, host in mounted.items():
        assert mount == "/host" + host, (mount, host)
    defaults = NodeInstall()
    for path in (defaults.containerd_config, defaults.dropin, defaults.kata_config,
                 defaults.record):  # fmt: skip
        assert any(str(path).startswith(host + "/") for host in mounted.values()), path
    assert pod["nodeSelector"] == {"node.kubernetes.io/peerpods": "true"}
    assert "node" in yaml.safe_load((root / "kustomization.yaml").read_text())["resources"]


def _doc_blocks() -> list[dict[str, Any]]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    return [tomllib.loads(b) for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S)]


@pytest.mark.parametrize("shim", ["go", "rs"])
def test_the_installed_kata_configuration_is_the_documented_one(shim: str) -> None:
    documented = [b for b in _doc_blocks() if "remote" in b.get("hypervisor", {})]
    go, rs = documented  # docs/install.md: the Go runtime's, then runtime-rs's
    written = kata_configuration(NodeInstall.build(shim=shim))
    assert written == (go if shim == "go" else rs)


def test_the_installed_runtime_is_the_documented_one() -> None:
    documented = [b for b in _doc_blocks() if "plugins" in b]
    v2, v3 = documented
    go = NodeInstall.build(
        kata_config="/opt/kata/share/defaults/kata-containers/configuration-remote.toml"
    )
    rs = NodeInstall.build(
        shim="rs", kata_config="/etc/kata-containers/runtime-rs/configuration-remote.toml"
    )
    for settings, doc, plugin in ((go, v2, "io.containerd.grpc.v1.cri"),
                                  (rs, v3, "io.containerd.cri.v1.runtime")):  # fmt: skip
        main_file = {"version": 2 if plugin.endswith("grpc.v1.cri") else 3}
        dropin = containerd_dropin(settings.model_copy(update={"snapshotter": ""}), main_file)
        runtime = dropin["plugins"][plugin]["containerd"]["runtimes"]["kata-remote"]
        assert runtime == doc["plugins"][plugin]["containerd"]["runtimes"]["kata-remote"]
