"""The pod VM recipe (config/podvm) as cloud-api-adaptor's podvm build reads it: mkosi's own parse
(`mkosi --json summary`, the mkosi tests/podvm/fetch-recipe-tools unpacked from Debian) of a
stand-in of CAA's podvm folder with the same structure (a top-level mkosi.conf, the `initrd` and
`system` subimages, `system` depending on `initrd`, CAA's own post-installation script, repart
files and profiles), after `add-to-caa` put our files in. What must hold: our packages, scripts,
extra tree and partition are in the *system* image's parsed configuration. The package names are
checked against the distributions' indexes (Debian's through apt-cache on the private index the
fetch script made; Ubuntu's against the list of facts beside this file), and the wheel is staged
for real, also by a stock python3 whose setuptools cannot build wheels."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PODVM = ROOT / "config" / "podvm"
SCRIPTS = PODVM / "scripts"
DROPINS = PODVM / "mkosi.images" / "system" / "mkosi.conf.d"
FACTS = Path(__file__).with_name("ubuntu_nvidia_packages.txt")
UNITS = (
    "peerpods-podvm-prepare.service",
    "var-lib-peerpods-podvm.mount",
    "peerpods-podvm-warm.service",
    "var-lib-peerpods-images.mount",
    "peerpods-image-mirror.service",
)
CDH_DROPIN = "confidential-data-hub.service.d/60-peerpods.conf"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CACHE = Path(os.environ.get("PEERPODS_TOOLS_CACHE", Path.home() / ".cache" / "peerpods"))
MKOSI = CACHE / "mkosi" / "usr" / "lib" / "python3" / "dist-packages"
APT = CACHE / "apt"
BUILD_WHEELS = CACHE / "build-wheels"
STOCK_PYTHON = Path("/usr/bin/python3")

# A stand-in of CAA's src/cloud-api-adaptor/podvm, written here (no CAA file is copied): the
# same folders and the same kinds of settings, so mkosi resolves it as it resolves CAA's.
STANDIN: dict[str, str] = {
    "mkosi.conf": "[Build]\nEnvironment=SOURCE_DATE_EPOCH=0\n\n[Output]\nOutputDirectory=build\n\n"
    "[Distribution]\nDistribution=ubuntu\nRelease=resolute\nRepositories=universe\n",
    "mkosi.images/initrd/mkosi.conf": "[Output]\nFormat=cpio\nOutput=initrd\n\n"
    "[Content]\nMakeInitrd=yes\nBootable=no\nPackages=systemd\n         udev\n",
    "mkosi.images/system/mkosi.conf": "[Config]\nDependencies=initrd\n\n[Content]\n"
    "Bootable=true\nBootloader=uki\nKernelCommandLine=systemd.volatile=state\n"
    "Initrds=../../build/initrd\n\n[Output]\nOutput=system\n",
    "mkosi.images/system/mkosi.conf.d/ubuntu.conf": "[Match]\nDistribution=ubuntu\n\n[Content]\n"
    "SkeletonTrees=../../resources/binaries-tree\nPackages=\n    linux-image-generic\n"
    "    systemd\n    iproute2\n",
    "mkosi.images/system/mkosi.conf.d/debian.conf": "[Match]\nDistribution=debian\n\n[Content]\n"
    "Packages=\n    linux-image-amd64\n    systemd\n",
    "mkosi.images/system/mkosi.postinst": "#!/bin/sh\necho stand-in for CAA's postinst\n",
    "mkosi.images/system/mkosi.repart/10-root.conf": "[Partition]\nType=root\nFormat=squashfs\n"
    "CopyFiles=/\n",
    "mkosi.images/system/mkosi.profiles/production.conf": "[Build]\n"
    "Environment=VARIANT_ID=production\n",
}


def _needs(what: str, present: bool) -> None:
    if present:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (tests/run runs tests/podvm/fetch-recipe-tools)")
    pytest.skip(f"{what} is missing (run tests/podvm/fetch-recipe-tools)")


def run(*command: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    if check:
        assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def standin(where: Path) -> Path:
    podvm = where / "podvm"
    for name, text in STANDIN.items():
        path = podvm / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (podvm / "mkosi.images/system/mkosi.postinst").chmod(0o755)
    (podvm / "resources/binaries-tree").mkdir(parents=True)
    return podvm


def summary(podvm: Path, *options: str) -> dict[str, dict[str, Any]]:
    """mkosi's parse of the tree as CAA's image build runs it (`mkosi --profile=production`),
    one entry per image."""
    _needs("mkosi (unpacked from Debian)", (MKOSI / "mkosi").is_dir())
    env = dict(os.environ, PYTHONPATH=str(MKOSI))
    done = run(sys.executable, "-m", "mkosi", "--profile=production", *options, "--json",
               "summary", cwd=podvm, env=env)  # fmt: skip
    return {image["Image"]: image for image in json.loads(done.stdout)["Images"]}


def dropin_packages(name: str) -> list[str]:
    """The Packages= list of one of our drop-ins."""
    packages: list[str] = []
    inside = False
    for line in (DROPINS / name).read_text().splitlines():
        if line.startswith("Packages="):
            inside = True
            packages += line.removeprefix("Packages=").split()
        elif inside and line[:1].isspace() and line.strip():
            packages += line.split()
        else:
            inside = False
    return packages


@pytest.fixture
def added(tmp_path: Path) -> Path:
    podvm = standin(tmp_path)
    run(SCRIPTS / "add-to-caa", podvm)
    return podvm


def test_the_additions_land_in_the_system_subimage(added: Path) -> None:
    images = summary(added)
    system = images["system"]
    ours = dropin_packages("60-peerpods-ubuntu.conf")
    assert set(ours) <= set(system["Packages"])
    assert "linux-image-generic" in system["Packages"]  # CAA's own list is kept
    assert not set(ours) & set(images["initrd"]["Packages"])
    # our script runs after CAA's own post-installation script
    assert system["PostInstallationScripts"] == [
        str(added / "mkosi.images/system/mkosi.postinst"),
        str(added / "mkosi.images/system/peerpods.postinst.chroot"),
    ]
    extra = Path(system["ExtraTrees"][0]["Source"])
    assert extra == added / "mkosi.images/system/peerpods.extra"
    for unit in UNITS:
        assert (extra / "etc/systemd/system" / unit).read_bytes() == (
            PODVM / "systemd" / unit
        ).read_bytes()
    # the drop-in for CAA's CDH unit, and the image cache's partition, made at the first boot
    assert (extra / "etc/systemd/system" / CDH_DROPIN).read_bytes() == (
        PODVM / "systemd" / CDH_DROPIN
    ).read_bytes()
    assert (extra / "usr/lib/repart.d/60-peerpods-images.conf").read_bytes() == (
        PODVM / "repart.d/60-peerpods-images.conf"
    ).read_bytes()
    # the post-installation script enables every unit there is to enable
    postinst = (added / "mkosi.images/system/peerpods.postinst.chroot").read_text()
    enabled = postinst.split("systemctl enable", 1)[1].replace("\\\n", " ").split()
    assert sorted(enabled) == sorted(UNITS)
    for script in ("install-peerpods", "install-nvidia"):
        staged = extra / "usr/local/libexec/peerpods" / script
        assert staged.read_bytes() == (SCRIPTS / script).read_bytes()
        assert os.access(staged, os.X_OK)
    wheel = f"peerpods-{VERSION}-py3-none-any.whl"
    assert wheel in (extra / "opt/peerpods/dist/SHA256SUMS").read_text()
    repart = [Path(d) for d in system["RepartDirectories"]]
    assert (added / "mkosi.images/system/mkosi.repart") in repart
    assert (repart[0] / "60-peerpods-state.conf").is_file()
    assert (repart[0] / "10-root.conf").is_file()
    # what a subimage cannot set, on the top-level image, which every image inherits
    for image in images.values():
        assert image["Repositories"] == ["universe", "restricted"]
        assert image["WithNetwork"] is True


def test_a_top_level_drop_in_never_reaches_the_system_image(tmp_path: Path) -> None:
    """Why nothing of ours sits beside CAA's top-level mkosi.conf: mkosi keeps it there."""
    podvm = standin(tmp_path)
    (podvm / "mkosi.conf.d").mkdir()
    (podvm / "mkosi.conf.d/50-top.conf").write_text("[Content]\nPackages=nvidia-utils-580-server\n")
    images = summary(podvm)
    assert "nvidia-utils-580-server" in images["main"]["Packages"]
    assert "nvidia-utils-580-server" not in images["system"]["Packages"]


def test_adding_twice_leaves_one_copy(added: Path) -> None:
    run(SCRIPTS / "add-to-caa", added)
    conf = (added / "mkosi.conf").read_text()
    assert conf.count("add-to-caa): begin") == 1 and conf.count("Repositories=restricted") == 1
    assert conf.startswith(STANDIN["mkosi.conf"])
    dist = added / "mkosi.images/system/peerpods.extra/opt/peerpods/dist"
    assert len(list(dist.iterdir())) == 2


def test_a_folder_that_is_not_caas_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "mkosi.conf").write_text("[Content]\n")
    done = run(SCRIPTS / "add-to-caa", tmp_path, check=False)
    assert done.returncode == 1 and "mkosi.images/system" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mkosi.conf"]
    assert (tmp_path / "mkosi.conf").read_text() == "[Content]\n"
    done = run(SCRIPTS / "add-to-caa", tmp_path, "--distribution", "fedora", check=False)
    assert done.returncode == 2 and "want ubuntu or debian" in done.stderr


def test_the_debian_variant_parses_with_debian_names_from_debians_index(tmp_path: Path) -> None:
    podvm = standin(tmp_path)
    run(SCRIPTS / "add-to-caa", podvm, "--distribution", "debian")
    images = summary(podvm, "--distribution=debian", "--release=trixie")
    system = images["system"]
    ours = dropin_packages("60-peerpods-debian.conf")
    assert set(ours) <= set(system["Packages"])
    assert not [p for p in system["Packages"] if "580" in p]  # no Ubuntu name leaks in
    assert {"contrib", "non-free", "non-free-firmware"} <= set(system["Repositories"])
    _needs("the private Debian index", (APT / "sources.list").is_file())
    for name in ours:
        shown = run("apt-cache", *_apt_options(), "show", "--no-all-versions", name, check=False)
        assert f"Package: {name}" in shown.stdout, f"{name}: not in Debian"
    # one version of the driver throughout: the module source, firmware and user space
    nvidia = {
        n: run("apt-cache", *_apt_options(), "show", "--no-all-versions", n).stdout
        for n in ("nvidia-open-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi", "libnvidia-ml1")
    }
    upstream = {n: re.findall(r"^Version: ([\d.]+)", t, re.M) for n, t in nvidia.items()}
    assert len({tuple(v) for v in upstream.values()}) == 1, upstream


def _apt_options() -> list[str]:
    return [
        "-o", f"Dir::Etc::SourceList={APT / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/nonexistent",
        "-o", f"Dir::State::Lists={APT / 'lists'}",
        "-o", f"Dir::Cache={APT}",
    ]  # fmt: skip


def test_the_ubuntu_driver_is_one_server_series_for_caas_kernel() -> None:
    facts: dict[str, set[str]] = {}
    for line in FACTS.read_text().splitlines():
        if line and not line.startswith("#"):
            kind, name = line.split()
            facts.setdefault(kind, set()).add(name)
    ours = [p for p in dropin_packages("60-peerpods-ubuntu.conf") if "nvidia" in p]
    known = facts["module"] | facts["userspace"]
    assert set(ours) <= known, set(ours) - known
    series = {re.search(r"nvidia-(?:[a-z-]+-)?(\d{3})-server", p).group(1) for p in ours}  # type: ignore[union-attr]
    assert len(series) == 1, ours  # never a desktop module beside server user space
    assert all("-server" in p for p in ours)
    modules = [p for p in ours if p in facts["module"]]
    assert len(modules) == 1, "one prebuilt module package"
    (kernel,) = facts["kernel"]
    flavour = kernel.removeprefix("linux-image-")
    assert modules[0].endswith(f"-open-{flavour}")  # the open modules, for CAA's kernel flavour
    assert any(p.startswith("nvidia-headless-no-dkms-") for p in ours)  # no DKMS beside them
    assert "dkms" not in dropin_packages("60-peerpods-ubuntu.conf")


def _wheel_files(dist: Path) -> tuple[Path, str]:
    sums = (dist / "SHA256SUMS").read_text().split()
    wheel = dist / sums[1]
    import hashlib

    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sums[0]
    return wheel, sums[1]


def test_stage_wheel_builds_this_trees_wheel(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    done = run(SCRIPTS / "stage-wheel", tmp_path, env=env)
    wheel, name = _wheel_files(tmp_path / "opt/peerpods/dist")
    assert name == f"peerpods-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"adaptor/__init__.py", "webhook/__init__.py", "providers/__init__.py"} <= names
        assert (ROOT / "adaptor/podvm/prepare.py").read_bytes() == archive.read(
            "adaptor/podvm/prepare.py"
        )
    assert "staged" in done.stdout


def test_stage_wheel_works_on_a_stock_python_without_bdist_wheel(tmp_path: Path) -> None:
    """Debian's python3 (setuptools 66, no `wheel`): `setup.py bdist_wheel` would fail with
    "invalid command 'bdist_wheel'"; stage-wheel builds in pip's isolated environment instead,
    here offline from the build requirements fetched beforehand."""
    _needs("Debian's python3 with pip", STOCK_PYTHON.exists() and run(
        STOCK_PYTHON, "-m", "pip", "--version", check=False).returncode == 0)  # fmt: skip
    can_build = run(STOCK_PYTHON, "-c", "from setuptools.command import bdist_wheel", check=False)
    _needs("the wheel's build requirements", any(BUILD_WHEELS.glob("setuptools-*.whl")))
    env = dict(
        os.environ, PYTHON=str(STOCK_PYTHON), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(BUILD_WHEELS)
    )
    env.pop("PIP_CONSTRAINT", None)
    done = run(SCRIPTS / "stage-wheel", tmp_path, env=env)
    if can_build.returncode != 0:
        assert "isolated build" in done.stdout
    _, name = _wheel_files(tmp_path / "opt/peerpods/dist")
    assert name == f"peerpods-{VERSION}-py3-none-any.whl"


def test_the_image_installs_only_the_staged_wheel() -> None:
    """The operator check: the recipe never pulls peerpods from a package index by name."""
    install = (SCRIPTS / "install-peerpods").read_text()
    assert 'pip install --quiet --no-cache-dir "$dist/$wheel[podvm]"' in install
    assert "sha256sum --check --strict" in install
    for path in PODVM.rglob("*"):
        if path.is_file() and path.suffix != ".md":
            text = path.read_text()
            assert not re.search(r"pip3? install[^\n]*\bpeerpods\b(?!/)", text), path


def _fake_module(root: Path, kernel: str, version: str) -> None:
    """A kernel module file with nothing but the version fields modinfo reads."""
    source = root / "m.c"
    source.write_text(
        'const char info[] __attribute__((section(".modinfo"), used)) = '
        f'"version={version}\\0license=Dual MIT/GPL\\0name=nvidia\\0";\n'
    )
    folder = root / "lib/modules" / kernel / "kernel/nvidia"
    folder.mkdir(parents=True)
    run("gcc", "-c", source, "-o", folder / "nvidia.ko")
    run("depmod", "-b", root, kernel)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text("ID=ubuntu\n")
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)


@pytest.mark.parametrize(
    ("user_space", "code"), [("580.95.05", 0), ("595.71.05", 1)], ids=["one-series", "mixed"]
)
def test_install_nvidia_stops_a_build_whose_module_and_user_space_differ(
    tmp_path: Path, user_space: str, code: int
) -> None:
    _needs("gcc and kmod", all(shutil.which(t) for t in ("gcc", "depmod", "modinfo")))
    _fake_module(tmp_path, "7.0.0-30-generic", "580.95.05")
    (tmp_path / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{user_space}").touch()
    env = dict(os.environ, PEERPODS_IMAGE_ROOT=str(tmp_path))
    done = run(SCRIPTS / "install-nvidia", "--check", env=env, check=False)
    assert done.returncode == code, done.stderr
    if code:
        assert "kernel module 580.95.05 but user space 595.71.05" in done.stderr
    else:
        assert "nvidia 580.95.05 for 7.0.0-30-generic" in done.stdout
