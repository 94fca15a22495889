"""docs/images.md: the pod VM image boots only with UEFI, so every command that registers it
carries its cloud's UEFI setting (and the formats each cloud imports), and each cloud has one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "images.md"


def commands() -> list[list[str]]:
    """Every shell command of the page's sh blocks, continuation lines joined, split as sh
    would."""
    found: list[list[str]] = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                found.append(shlex.split(line))
    return found


def named(prefix: tuple[str, ...]) -> list[list[str]]:
    return [c for c in commands() if tuple(c[: len(prefix)]) == prefix]


def option(command: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V`; "" for a flag without a value."""
    for i, word in enumerate(command):
        if word == name:
            following = command[i + 1] if i + 1 < len(command) else ""
            return "" if following.startswith("--") else following
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def test_every_aws_image_is_uefi_with_ena() -> None:
    registers = named(("aws", "ec2", "register-image"))
    assert registers
    for command in registers:
        assert option(command, "--boot-mode") == "uefi", command
        assert option(command, "--ena-support") == "", command
        assert option(command, "--architecture") == "x86_64"
    (imported,) = named(("aws", "ec2", "import-snapshot"))
    assert "Format=RAW" in (option(imported, "--disk-container") or "")


def test_every_azure_image_is_generation_2_from_a_fixed_vhd_page_blob() -> None:
    definitions = named(("az", "sig", "image-definition", "create")) + named(
        ("az", "image", "create")
    )
    assert len(definitions) == 2
    for command in definitions:
        assert option(command, "--hyper-v-generation") == "V2", command
    (upload,) = named(("az", "storage", "blob", "upload"))
    assert option(upload, "--type") == "page"
    vhd = [c for c in named(("qemu-img", "convert")) if "vpc" in c]
    assert vhd and "subformat=fixed" in (option(vhd[0], "-o") or "")


def test_every_gcp_image_is_uefi_compatible() -> None:
    creates = named(("gcloud", "compute", "images", "create"))
    assert creates
    for command in creates:
        features = (option(command, "--guest-os-features") or "").split(",")
        assert "UEFI_COMPATIBLE" in features, command
        assert "GVNIC" in features  # A3/A4: gVNIC is their only interface
    tars = [c for c in commands() if c[0] == "tar"]
    assert tars and "disk.raw" in tars[0]


def test_the_page_is_reachable_from_the_install_guide_and_the_recipe() -> None:
    assert "images.md" in (ROOT / "docs" / "install.md").read_text()
    assert "docs/images.md" in (ROOT / "config" / "podvm" / "README.md").read_text()
    for link in re.findall(r"\]\(([^)#\s]+)", DOC.read_text()):
        if "://" not in link:
            assert (DOC.parent / link).resolve().exists(), link
