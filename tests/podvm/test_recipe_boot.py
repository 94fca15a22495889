"""The recipe's warm boot and adoption boot as systemd sees them, without booting a VM:

- `systemd-analyze verify` of our units, enabled by `systemctl --root` as the post-installation
  script enables them, beside stand-ins of CAA's units (written here) and this machine's systemd
  units: no error, no ordering cycle, also with cloud-init's final stage ordered after
  multi-user.target as cloud-init orders it (an ordering after it would be a cycle: shown);
- systemd-repart's plan for the first boot of an image made by our build-time partition file,
  with CAA's trusted_store definition and our image cache's: both growing partitions get space by
  weight, the state partition is left as it is (with the generic type it would be taken for
  trusted_store: shown); the boot after changes nothing;
- the CDH drop-in's start line run for real: CDH gets our configuration when there is one, else
  the operator's, else none, as CAA's unit starts it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adaptor.podvm.warmrequest import apf_document

ROOT = Path(__file__).resolve().parents[2]
PODVM = ROOT / "config" / "podvm"
SYSTEMD = PODVM / "systemd"
OURS = (
    "peerpods-podvm-prepare.service",
    "var-lib-peerpods-podvm.mount",
    "peerpods-podvm-warm.service",
    "var-lib-peerpods-images.mount",
    "peerpods-image-mirror.service",
)
DROPIN = "confidential-data-hub.service.d/60-peerpods.conf"
# CAA's units ours are ordered against (stand-ins: a description and a no-op)
CAA = (
    "process-user-data.service",
    "kata-agent.service",
    "agent-protocol-forwarder.service",
    "confidential-data-hub.service",
    "nvidia-persistenced.service",
    "cloud-init.service",
)
HOST_UNITS = Path("/lib/systemd/system")


def _needs(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing and HOST_UNITS.is_dir():
        return
    reason = f"needs {', '.join(missing) or HOST_UNITS} (Debian's systemd)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """A root with systemd's own units, CAA's stand-ins, the binaries our units start, and our
    units enabled by `systemctl --root` as peerpods.postinst.chroot enables them."""
    _needs("systemd-analyze", "systemctl")
    root = tmp_path / "root"
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    (units / "confidential-data-hub.service.d").mkdir(parents=True)
    for unit in CAA:
        (units / unit).write_text(
            f"[Unit]\nDescription=stand-in for CAA's {unit}\n\n"
            "[Service]\nType=oneshot\nExecStart=/bin/sh -c :\n"
        )
    for unit in OURS:
        shutil.copyfile(SYSTEMD / unit, units / unit)
    shutil.copyfile(SYSTEMD / DROPIN, units / DROPIN)
    (root / "bin").mkdir()
    for tool in ("sh", "grep"):
        shutil.copy2(f"/bin/{tool}", root / "bin" / tool)
    executable(root / "opt/peerpods/bin/peerpods")
    executable(root / "usr/local/bin/confidential-data-hub")
    enabled = run("systemctl", f"--root={root}", "enable", *OURS)
    assert enabled.returncode == 0, enabled.stderr
    return root


def verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return run("systemd-analyze", "verify", f"--root={root}", "--man=no", *units)


def test_systemd_verifies_the_warm_and_adoption_units(image_root: Path) -> None:
    wants = image_root / "etc/systemd/system/multi-user.target.wants"
    assert {p.name for p in wants.iterdir()} >= {
        "peerpods-podvm-warm.service",
        "var-lib-peerpods-images.mount",
    }
    mirror_wanted = image_root / "etc/systemd/system/confidential-data-hub.service.wants"
    assert (mirror_wanted / "peerpods-image-mirror.service").is_symlink()
    # cloud-init's last stage as cloud-init orders it: after multi-user.target
    final = image_root / "etc/systemd/system/cloud-final.service"
    final.write_text(
        "[Unit]\nDescription=stand-in for cloud-init's final stage\nAfter=multi-user.target\n\n"
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c :\n"
    )
    (wants / "cloud-final.service").symlink_to("../cloud-final.service")
    units = [f"/etc/systemd/system/{u}" for u in (*OURS, "confidential-data-hub.service")]
    done = verify(image_root, *units, "multi-user.target", "kata-agent.service")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr  # no cycle, not even a warning
    # the warm unit ordered after cloud-init's final stage, with the default dependencies that
    # order multi-user.target after it, is a cycle, and verify says so (the check can fail)
    warm = image_root / "etc/systemd/system/peerpods-podvm-warm.service"
    text = warm.read_text().replace("DefaultDependencies=no\n", "")
    warm.write_text(text.replace("After=process-user-data.service", "After=cloud-final.service"))
    cyclic = verify(
        image_root, "/etc/systemd/system/peerpods-podvm-warm.service", "multi-user.target"
    )
    assert "ordering cycle" in cyclic.stderr


def test_the_warm_unit_runs_before_the_agent_and_after_its_request() -> None:
    text = (SYSTEMD / "peerpods-podvm-warm.service").read_text()
    after = " ".join(re.findall(r"^After=(.*)$", text, re.M)).split()
    before = " ".join(re.findall(r"^Before=(.*)$", text, re.M)).split()
    assert {"process-user-data.service", "var-lib-peerpods-images.mount"} <= set(after)
    assert {"network-online.target", "nvidia-persistenced.service"} <= set(after)
    assert {"kata-agent.service", "agent-protocol-forwarder.service"} <= set(before)
    mirror = (SYSTEMD / "peerpods-image-mirror.service").read_text()
    assert "Before=confidential-data-hub.service" in mirror
    assert "ConditionFileNotEmpty=/var/lib/peerpods/images/index.json" in mirror


def test_a_pods_boot_skips_the_warm_unit_without_starting_python(tmp_path: Path) -> None:
    text = (SYSTEMD / "peerpods-podvm-warm.service").read_text()
    (line,) = re.findall(r"(?m)^ExecCondition=(.*)$", text)
    argv = shlex.split(line)  # systemd's quoting, as far as this line uses it
    apf = tmp_path / "apf.json"
    argv = [str(apf) if a == "/run/peerpod/apf.json" else a for a in argv]

    def condition(document: object) -> int:
        apf.write_text(json.dumps(document, separators=(",", ":")))
        return subprocess.run(argv, timeout=30).returncode

    assert condition(apf_document(["busybox"])) == 0  # a warm boot: the unit runs
    assert condition({"pod-name": "train", "pod-network": None}) == 1  # a pod's: skipped
    apf.unlink()
    assert subprocess.run(argv, timeout=30, stderr=subprocess.DEVNULL).returncode == 2  # skipped


# systemd-repart: the build's partitions, then the first boot's plan

CAA_BUILD = {
    "10-root.conf": "[Partition]\nType=root\nSizeMinBytes=1G\nSizeMaxBytes=1G\n",
    "20-root-verity.conf": "[Partition]\nType=root-verity\nSizeMinBytes=72M\nSizeMaxBytes=72M\n",
}
CAA_FIRST_BOOT = {
    "30-scratch.conf": "[Partition]\nType=linux-generic\nLabel=trusted_store\nFormat=ext4\n",
}


def definitions(where: Path, files: dict[str, str]) -> Path:
    where.mkdir(parents=True)
    for name, text in files.items():
        (where / name).write_text(text)
    return where


def repart(image: Path, defs: Path, *options: str) -> list[dict[str, Any]]:
    done = run("systemd-repart", *options, f"--definitions={defs}", "--json=short", image)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def built_image(tmp_path: Path, state_conf: str) -> Path:
    """The image as mkosi lays it out (root, verity, our state partition), 2 GiB."""
    build = definitions(tmp_path / "build", {**CAA_BUILD, "60-peerpods-state.conf": state_conf})
    image = tmp_path / "disk.raw"
    repart(image, build, "--dry-run=no", "--empty=create", "--size=2G")
    return image


def by_label(plan: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["label"]: p for p in plan}


def test_the_first_boot_gives_both_growing_partitions_space(tmp_path: Path) -> None:
    _needs("systemd-repart")
    state = (PODVM / "mkosi.images/system/mkosi.repart/60-peerpods-state.conf").read_text()
    image = built_image(tmp_path, state)
    first_boot = definitions(tmp_path / "first-boot", {
        **CAA_FIRST_BOOT,
        "60-peerpods-images.conf": (PODVM / "repart.d/60-peerpods-images.conf").read_text(),
    })  # fmt: skip
    # the cloud disk is 100 GiB
    plan = by_label(repart(image, first_boot, "--dry-run=yes", "--size=100G"))
    assert plan["trusted_store"]["activity"] == "create"
    assert plan["peerpods-images"]["activity"] == "create"
    assert plan["peerpods-state"]["activity"] == "unchanged"
    assert plan["peerpods-state"]["file"] == "-"  # matched with no definition: left alone
    images, trusted = plan["peerpods-images"]["raw_size"], plan["trusted_store"]["raw_size"]
    assert images + trusted > 95 << 30  # the free space, shared
    assert abs(trusted / images - 2) < 0.01  # by weight: 1000 to 500
    # the boot after: the partitions exist, nothing changes (formats left out: no mkfs here)
    applied = definitions(tmp_path / "applied", {
        name: text.replace("Format=ext4\n", "")
        for name, text in {**CAA_FIRST_BOOT, "60-peerpods-images.conf": (
            PODVM / "repart.d/60-peerpods-images.conf").read_text()}.items()
    })  # fmt: skip
    repart(image, applied, "--dry-run=no", "--size=100G")
    again = repart(image, first_boot, "--dry-run=yes", "--size=100G")
    assert {p["activity"] for p in again} == {"unchanged"}
    # a disk with less room than the cache's minimum beside CAA's own fails as a whole (repart
    # refuses to make any): the minimum is kept small for that reason
    assert "SizeMinBytes=256M" in (PODVM / "repart.d/60-peerpods-images.conf").read_text()


def test_a_generic_state_partition_would_be_taken_for_trusted_store(tmp_path: Path) -> None:
    """Why our partitions have their own type UUIDs: repart pairs definitions with partitions by
    type, so a linux-generic state partition is CAA's trusted_store to the first boot."""
    _needs("systemd-repart")
    state = (PODVM / "mkosi.images/system/mkosi.repart/60-peerpods-state.conf").read_text()
    generic = re.sub(r"(?m)^Type=.*$", "Type=linux-generic", state)
    image = built_image(tmp_path, generic)
    first_boot = definitions(tmp_path / "first-boot", CAA_FIRST_BOOT)
    plan = by_label(repart(image, first_boot, "--dry-run=yes", "--size=100G"))
    assert plan["peerpods-state"]["file"] == "30-scratch.conf"
    assert plan["peerpods-state"]["activity"] == "resize"
    assert "trusted_store" not in plan


# the CDH drop-in's start line


def test_cdh_starts_with_ours_else_the_operators_else_its_defaults(tmp_path: Path) -> None:
    text = (SYSTEMD / DROPIN).read_text()
    lines = re.findall(r"(?m)^ExecStart=(.*)$", text)
    assert lines[0] == ""  # CAA's start line is reset, then ours
    argv = re.fullmatch(r"/bin/sh -c '(.*)'", lines[1])
    assert argv is not None
    script = argv.group(1).replace("$$", "$")  # systemd's escape of $
    script = script.replace("/run/", f"{tmp_path}/run/").replace(
        "/usr/local/bin/", f"{tmp_path}/bin/"
    )
    calls = tmp_path / "cdh.calls"
    executable(tmp_path / "bin/confidential-data-hub", f'#!/bin/sh\necho "$*" >> {calls}\n')
    ours, operators = tmp_path / "run/peerpods/cdh.toml", tmp_path / "run/peerpod/cdh.toml"

    def start() -> str:
        calls.unlink(missing_ok=True)
        assert subprocess.run(["/bin/sh", "-c", script], timeout=30).returncode == 0
        return calls.read_text().strip()

    assert start() == ""  # neither: CDH's defaults, as CAA starts it
    operators.parent.mkdir(parents=True)
    operators.write_text("[kbc]\n")
    assert start() == f"-c {operators}"  # the operator's, as CAA starts it
    ours.parent.mkdir(parents=True)
    ours.write_text("[kbc]\n")
    assert start() == f"-c {ours}"  # ours, written only when the store has images
    pre = re.findall(r"(?m)^ExecStartPre=-/bin/sh -c '(.*)'$", text)
    assert len(pre) == 1 and pre[0].endswith(
        "/opt/peerpods/bin/peerpods --log-format text podvm cdh-config"
    )
    # cdh-config runs only when the store holds an image
    gate = pre[0].replace("/var/lib/peerpods/images/", f"{tmp_path}/store/")
    gate = gate.replace("exec /opt/peerpods/bin/peerpods", f"exec {tmp_path}/bin/peerpods")
    ran = tmp_path / "cdh-config.ran"
    executable(tmp_path / "bin/peerpods", f'#!/bin/sh\necho "$*" > {ran}\n')
    assert subprocess.run(["/bin/sh", "-c", gate], timeout=30).returncode == 0
    assert not ran.exists()  # no store
    (tmp_path / "store").mkdir()
    (tmp_path / "store/index.json").write_text("")
    assert subprocess.run(["/bin/sh", "-c", gate], timeout=30).returncode == 0
    assert not ran.exists()  # a store that never recorded an image
    (tmp_path / "store/index.json").write_text('{"version": 1, "images": []}')
    assert subprocess.run(["/bin/sh", "-c", gate], timeout=30).returncode == 0
    assert ran.read_text().strip() == "--log-format text podvm cdh-config"
