"""The pod VM image recipe (config/podvm), built as far as CI can: the root file system layer as a
minimal Debian with systemd (mmdebstrap, cached like tests/test_image.py's base), peerpods'
wheel staged from this tree and installed by the recipe's own script in a chroot (an altered
wheel is refused and nothing installed), and systemd itself verifying our units inside that root
beside stand-ins for CAA's units. install-nvidia's choice of kernel is checked on a fake root.
Needs root and mmdebstrap (tests/run installs it); outside CI it skips without them. Slow:
minutes on the first run (the base is cached after)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PODVM = ROOT / "config" / "podvm"
SCRIPTS = PODVM / "scripts"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What CAA's image brings and our units order against: stand-ins that do nothing.
CAA_UNITS = (
    "kata-agent.service",
    "agent-protocol-forwarder.service",
    "process-user-data.service",
    "nvidia-persistenced.service",
    "confidential-data-hub.service",
)


def _needs_root_and_mmdebstrap() -> None:
    if os.geteuid() == 0 and shutil.which("mmdebstrap") and shutil.which("systemd-analyze"):
        return
    reason = "needs root, mmdebstrap and systemd-analyze"
    if os.environ.get("CI") == "true":
        pytest.fail(f"the pod VM image build {reason} (tests/run installs them)")
    pytest.skip(f"the pod VM image build {reason}")


def podvm_base() -> Path:
    """Debian with what a pod VM image has before the recipe (python3, its venv, systemd), as a
    tar file made once per package list (cached like tests/test_image.py's base)."""
    from tests.test_image import EXCLUDES, SUITE, _cache

    packages = ("python3", "python3-venv", "ca-certificates", "systemd", "kmod")
    key = hashlib.sha256("\n".join([SUITE, *packages, *EXCLUDES]).encode()).hexdigest()[:16]
    tar = _cache() / f"podvm-{SUITE}-{key}.tar"
    if not tar.exists():
        partial = tar.with_suffix(".partial")
        run(
            "mmdebstrap", "--variant=minbase", "--mode=root",
            f"--include={','.join(packages)}",
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDES),
            "--format=tar", SUITE, str(partial), timeout=1200,
        )  # fmt: skip
        partial.rename(tar)
    return tar


def run(*command: str, env: dict[str, str] | None = None, check: bool = True,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def chroot_env() -> dict[str, str]:
    keep = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(PATH=PATH, HOME="/root", LANG="C.UTF-8")
    if HOST_CA.exists():
        env["PIP_CERT"] = str(HOST_CA)
    return env


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's root file system: Debian with python3, this tree's wheel staged into it."""
    _needs_root_and_mmdebstrap()
    root = tmp_path_factory.mktemp("podvm-root")
    # the base is made here by mmdebstrap (device nodes, owners kept): extracted as it is; the
    # filter argument exists from Python 3.11.4 (and is needed from 3.14), Debian 12 has 3.11.2
    trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    with tarfile.open(podvm_base()) as tar:
        tar.extractall(root, **trusted)
    for host_file in (HOST_CA, Path("/etc/resolv.conf")):
        if host_file.exists():
            target = root / host_file.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(host_file, target)
    run(str(SCRIPTS / "stage-wheel"), str(root))
    libexec = root / "usr/local/libexec/peerpods"
    libexec.mkdir(parents=True)
    for script in ("install-peerpods", "install-nvidia"):
        shutil.copy2(SCRIPTS / script, libexec / script)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_an_altered_wheel_is_refused_and_nothing_is_installed(rootfs: Path) -> None:
    dist = rootfs / "opt/peerpods/dist"
    saved = {p.name: p.read_bytes() for p in dist.iterdir()}
    wheel = next(dist.glob("peerpods-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    try:
        done = run("chroot", str(rootfs), "/usr/local/libexec/peerpods/install-peerpods",
                   env=chroot_env(), check=False)  # fmt: skip
        assert done.returncode == 1
        assert "does not match SHA256SUMS: not installed" in done.stderr
        assert not (rootfs / "opt/peerpods/bin").exists()
    finally:
        for name, data in saved.items():
            (dist / name).write_bytes(data)


@pytest.mark.slow
def test_the_wheel_from_this_tree_is_installed_and_runs(rootfs: Path) -> None:
    sums = (rootfs / "opt/peerpods/dist/SHA256SUMS").read_text()
    assert f"peerpods-{VERSION}-py3-none-any.whl" in sums
    run("chroot", str(rootfs), "/usr/local/libexec/peerpods/install-peerpods", env=chroot_env())
    version = run("chroot", str(rootfs), "/opt/peerpods/bin/peerpods", "--version",
                  env=chroot_env()).stdout  # fmt: skip
    assert version.strip() == f"peerpods {VERSION}"
    # the podvm extra: NVML's bindings, imported only by prepare
    run("chroot", str(rootfs), "/opt/peerpods/bin/python", "-c", "import pynvml", env=chroot_env())
    assert not (rootfs / "opt/peerpods/dist").exists()  # the staged wheel leaves the image
    assert (rootfs / "var/lib/peerpods/podvm").is_dir()


@pytest.mark.slow
def test_systemd_verifies_our_units_in_the_image(rootfs: Path) -> None:
    if not (rootfs / "opt/peerpods/bin/peerpods").exists():
        run("chroot", str(rootfs), "/usr/local/libexec/peerpods/install-peerpods",
            env=chroot_env())  # fmt: skip
    units = rootfs / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in CAA_UNITS:
        (units / unit).write_text(
            f"[Unit]\nDescription=stand-in for CAA's {unit}\n\n"
            "[Service]\nType=oneshot\nExecStart=/bin/true\n"
        )
    ours = [
        PODVM / "systemd/peerpods-podvm-prepare.service",
        PODVM / "systemd/var-lib-peerpods-podvm.mount",
        PODVM / "systemd/peerpods-podvm-warm.service",
        PODVM / "systemd/var-lib-peerpods-images.mount",
        PODVM / "systemd/peerpods-image-mirror.service",
    ]
    for unit in ours:
        shutil.copyfile(unit, units / unit.name)
    # the drop-in for CAA's CDH unit, and the CDH binary it starts (a stand-in)
    dropin = "confidential-data-hub.service.d/60-peerpods.conf"
    (units / dropin).parent.mkdir(exist_ok=True)
    shutil.copyfile(PODVM / "systemd" / dropin, units / dropin)
    cdh = rootfs / "usr/local/bin/confidential-data-hub"
    cdh.parent.mkdir(parents=True, exist_ok=True)
    cdh.write_text("#!/bin/sh\n")
    cdh.chmod(0o755)
    # enabled as peerpods.postinst.chroot enables them, by the image's own systemctl
    run("chroot", str(rootfs), "systemctl", "enable", *(u.name for u in ours), env=chroot_env())
    done = run(
        "systemd-analyze", "verify", f"--root={rootfs}", "--man=no",
        *(f"/etc/systemd/system/{u.name}" for u in ours),
        "/etc/systemd/system/confidential-data-hub.service", "multi-user.target",
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr  # not even a warning
    # a unit that names a binary the image lacks is caught the same way (the check can fail)
    broken = units / "broken-peerpods.service"
    broken.write_text("[Service]\nType=oneshot\nExecStart=/opt/peerpods/bin/nonexistent\n")
    failed = run("systemd-analyze", "verify", f"--root={rootfs}", "--man=no",
                 "/etc/systemd/system/broken-peerpods.service", check=False)  # fmt: skip
    assert failed.returncode != 0
    broken.unlink()


def test_install_nvidia_builds_for_the_image_kernel_not_the_hosts(tmp_path: Path) -> None:
    for kernel in ("6.8.0-45-generic", "6.8.0-100-generic", "6.11.4-301.fc41.x86_64"):
        (tmp_path / "lib/modules" / kernel).mkdir(parents=True)
    done = subprocess.run(
        [str(SCRIPTS / "install-nvidia"), "--print-kernel"],
        env={**os.environ, "PEERPODS_IMAGE_ROOT": str(tmp_path)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "6.11.4-301.fc41.x86_64"  # the newest, by version order
    empty = subprocess.run(
        [str(SCRIPTS / "install-nvidia"), "--print-kernel"],
        env={**os.environ, "PEERPODS_IMAGE_ROOT": str(tmp_path / "none")},
        capture_output=True, text=True,
    )  # fmt: skip
    assert empty.returncode == 1 and "no kernel in" in empty.stderr


def test_the_recipe_never_installs_peerpods_by_name() -> None:
    for path in [*SCRIPTS.iterdir(), *(PODVM / "mkosi.images").rglob("*")]:
        if path.is_file():
            text = path.read_text()
            assert "peerpods[podvm]" not in text.replace('"$dist/$wheel[podvm]"', ""), path
    install = (SCRIPTS / "install-peerpods").read_text()
    assert "sha256sum --check" in install


def test_the_guard_lives_on_the_state_partition_mounted_before_prepare() -> None:
    mount = (PODVM / "systemd/var-lib-peerpods-podvm.mount").read_text()
    assert "Where=/var/lib/peerpods/podvm" in mount
    assert "What=/dev/disk/by-partlabel/peerpods-state" in mount
    assert "Before=peerpods-podvm-prepare.service" in mount and "nofail" in mount
    repart = (PODVM / "mkosi.images/system/mkosi.repart/60-peerpods-state.conf").read_text()
    assert "Label=peerpods-state" in repart and "Format=ext4" in repart
    prepare = (PODVM / "systemd/peerpods-podvm-prepare.service").read_text()
    assert "After=var-lib-peerpods-podvm.mount" in prepare
    for distro in ("ubuntu", "debian"):
        conf = (PODVM / f"mkosi.images/system/mkosi.conf.d/60-peerpods-{distro}.conf").read_text()
        assert f"Distribution={distro}" in conf
        assert "PostInstallationScripts=peerpods.postinst.chroot" in conf
