"""A pod VM's files under a test's directory, at the paths `peerpods podvm warm` and
`peerpods podvm cdh-config` use on a CAA image, and the commands' arguments naming them: one
layout for the warm boot's tests and the adoption boot's, so both boots meet on the same store.

The power-off and cloud-init are small scripts that record their calls; the mount table is a file
written here (the store's partition cannot be mounted in a test)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptor.podvm.imagecache.store import ImageStore, StoredManifest
from adaptor.podvm.warmboot import WarmOptions
from adaptor.podvm.warmrequest import apf_document
from tests.podvm.imagecache_peers import OCI_MANIFEST, sha256

PULL = f"{sys.executable} -m adaptor.cli.main --log-format text podvm pull-images"
# CAA's image's kernel command line: no agent.* image setting
CMDLINE = "console=ttyS0 systemd.firstboot=off systemd.volatile=state\n"


@dataclass
class Vm:
    """A VM's files in `root`, and scripts standing in for its power-off and cloud-init."""

    root: Path

    @property
    def apf(self) -> Path:
        return self.root / "run/peerpod/apf.json"

    @property
    def store(self) -> Path:
        return self.root / "var/lib/peerpods/images"

    @property
    def status(self) -> Path:
        return self.root / "var/lib/peerpods/podvm/warm-status.json"

    @property
    def mountinfo(self) -> Path:
        return self.root / "mountinfo"

    @property
    def operator(self) -> Path:
        return self.root / "run/peerpod/cdh.toml"

    @property
    def registries(self) -> Path:
        return self.root / "run/peerpods/registries.conf"

    @property
    def cdh(self) -> Path:
        return self.root / "run/peerpods/cdh.toml"

    @property
    def cmdline(self) -> Path:
        return self.root / "cmdline"

    # the warm boot

    def calls(self, name: str) -> list[str]:
        log = self.root / f"{name}.calls"
        return log.read_text().splitlines() if log.exists() else []

    def script(self, name: str) -> Path:
        path = self.root / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\necho "$*" >> {self.root}/{name}.calls\n')
        path.chmod(0o755)
        return path

    def mounts(self, *entries: tuple[str, str, str]) -> None:
        """The mount table: (mount point, options, file system type) each."""
        lines = [
            f"{n} 1 0:{n} / {point.replace(' ', chr(92) + '040')} {opts} shared:{n} - {fs} src rw"
            for n, (point, opts, fs) in enumerate(entries, start=20)
        ]
        self.mountinfo.write_text("\n".join(lines) + "\n")

    def on_partition(self) -> None:
        """The CAA image's layout: a read-only root, /var a tmpfs, the store its own ext4."""
        self.mounts(("/", "ro,relatime", "squashfs"), (str(self.root), "rw", "tmpfs"),
                    (str(self.store), "rw,nosuid,nodev", "ext4"))  # fmt: skip

    def request(self, *images: str) -> None:
        self.apf.parent.mkdir(parents=True, exist_ok=True)
        self.apf.write_text(json.dumps(apf_document(images)))

    def warm_argv(self, *extra: str, pull: str = PULL) -> list[str]:
        return [
            *("podvm", "warm", "--apf-json", str(self.apf), "--store", str(self.store)),
            *("--warm-status-file", str(self.status), "--mountinfo", str(self.mountinfo)),
            *("--poweroff-command", str(self.script("poweroff"))),
            *("--cloud-init", str(self.script("cloud-init")), "--pull-command", pull),
            *extra,
        ]

    def warm_options(self, **settings: Any) -> WarmOptions:
        """WarmOptions with this VM's paths; the commands (a pull-images and a poweroff-now by
        default, no cloud-init) and the rest from `settings`."""
        commands: dict[str, Any] = {
            "pull_command": ("pull-images",),
            "poweroff_command": ("poweroff-now",),
            "cloud_init": "",
        }
        return WarmOptions(
            apf_path=self.apf,
            store=self.store,
            status_path=self.status,
            mountinfo=self.mountinfo,
            **(commands | settings),
        )

    # the adoption's boot

    def cdh_argv(self, *extra: str) -> list[str]:
        if not self.cmdline.exists():  # CAA's image's, for the tests that do not set their own
            self.cmdline.write_text(CMDLINE)
        return [
            *("podvm", "cdh-config", "--store", str(self.store), "--cmdline", str(self.cmdline)),
            *("--operator-config", str(self.operator), "--registries-conf", str(self.registries)),
            *("--cdh-config", str(self.cdh), *extra),
        ]

    def put(self, registry: str, repository: str, tag: str) -> str:
        """An image of one manifest blob recorded in the store; its digest."""
        store = ImageStore(self.store)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "repo": repository})
        data = manifest.encode()
        digest = sha256(data)
        store.put(digest, data)
        stored = StoredManifest(digest, OCI_MANIFEST, len(data))
        store.record(registry, repository, {tag: stored}, [digest])
        return digest

    def operator_config(self, text: str) -> None:
        self.operator.parent.mkdir(parents=True, exist_ok=True)
        self.operator.write_text(text)
