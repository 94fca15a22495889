"""`podvm warm`: a warm pool VM's one boot: pull the pool's images onto disk, power off.

    apf.json without `peerpods-warm`  -> a pod's boot: nothing done, exit 0 at once
    apf.json with it                  -> the store must be on persistent storage (the image's
                                         `peerpods-images` partition, or any disk that is not
                                         tmpfs, ramfs or an overlay, mounted read-write)
                                      -> `peerpods podvm pull-images` into the store
                                      -> the status file, a console line per image
                                      -> where cloud-init is installed: wait for its last
                                         stage, `cloud-init clean --logs`
                                      -> sync, power off

The power-off is the VM's report to the warm pool keeper, so every warm boot ends in one, even
when the store is refused or a pull fails: the keeper then adopts a VM without that image, and
the pod's pull goes to the image's registry as on a cold VM. A pool waiting out its ready
timeout for a VM that will never report would be worse. The pull runs as its own process under
a deadline, so a stuck registry cannot keep the VM up past the keeper's timeout either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptor.podvm.status import write_atomic
from adaptor.podvm.warmrequest import MalformedWarmRequest, WarmRequest, read_request

log = logging.getLogger(__name__)

# file systems whose contents do not survive a stop
VOLATILE = frozenset({"tmpfs", "ramfs", "overlay", "devtmpfs"})
EXIT_OK = 0
EXIT_FAILED = 1

Runner = Callable[[Sequence[str], float | None], int]


@dataclass(frozen=True)
class WarmOptions:
    """Where `warm` reads and writes; built from `peerpods podvm warm`'s settings
    (`adaptor.cli.settings.PodvmWarmSettings`), whose defaults are a CAA pod VM's paths."""

    apf_path: Path
    store: Path
    status_path: Path
    pull_command: tuple[str, ...]  # `peerpods podvm pull-images`; --store and the images added
    poweroff_command: tuple[str, ...]
    cloud_init: str = "cloud-init"  # its path or name on PATH; "" never cleans
    auth: Path | None = None
    pull_timeout_seconds: float = 1500.0
    pull_attempts: int = 3
    retry_pause_seconds: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    mountinfo: Path = Path("/proc/self/mountinfo")


@dataclass
class WarmResult:
    """What one run did; `exit_code` is what the command returns."""

    warm: bool = False
    images: tuple[str, ...] = ()
    storage: str = ""  # why the store was refused; "" when it was not
    pull_exit: int | None = None
    stored: dict[str, bool] = field(default_factory=dict)
    cloud_init_cleaned: bool = False
    powered_off: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.errors else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": "failed" if self.errors else "ok",
            "images": {image: self.stored.get(image, False) for image in self.images},
            "storage_refused": self.storage,
            "pull_exit": self.pull_exit,
            "cloud_init_cleaned": self.cloud_init_cleaned,
            "errors": list(self.errors),
        }


def run_command(argv: Sequence[str], timeout: float | None) -> int:
    """Run `argv` with its output on ours (the console); its exit status, or 124 when it ran
    past `timeout` and was killed with every process it started (its own process group)."""
    try:
        process = subprocess.Popen(list(argv), start_new_session=True)
    except OSError as exc:
        log.error("%s: %s", argv[0], exc.strerror or exc)
        return 127
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        if process.returncode is None:  # past its deadline, or we were interrupted
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def warm(
    options: WarmOptions,
    runner: Runner = run_command,
    out: Callable[[str], None] = print,
) -> WarmResult:
    """Carry out this boot's warm request, if it has one; power off whatever happens."""
    result = WarmResult()
    try:
        request: WarmRequest | None = read_request(options.apf_path)
    except MalformedWarmRequest as exc:  # a warm boot all the same: it must still report
        result.errors.append(str(exc))
        request = WarmRequest()
    if request is None:
        return result  # a pod's boot
    result.warm, result.images = True, request.images
    try:
        _pull(options, request, result, runner, out)
    except Exception as exc:  # the power-off below must happen whatever went wrong
        log.exception("warm boot")
        result.errors.append(f"warm boot: {exc}")
    finally:
        _finish(options, result, runner, out)
    return result


def volatile_reason(store: Path, mountinfo: Path) -> str:
    """Why `store` would not survive a stop ("" when it would): the file system holding it,
    from the mount table, is in memory or read-only."""
    try:
        text = mountinfo.read_text(encoding="utf-8")
    except OSError as exc:
        return f"cannot read {mountinfo}: {exc.strerror or exc}"
    target = os.path.normpath(os.path.abspath(store))
    best: tuple[str, str, bool] | None = None
    for line in text.splitlines():
        mount = _mount_of(line)
        if mount is None:
            continue
        point = mount[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = mount  # the last of equal mount points is the one on top
    if best is None:
        return f"no mount holds {store}"
    point, fstype, read_only = best
    if fstype in VOLATILE:
        return (
            f"{store} is on {fstype} (mounted at {point}): what is pulled there is lost at the "
            "stop; the image's peerpods-images partition is not mounted there"
        )
    if read_only:
        return f"{store} is on a read-only {fstype} (mounted at {point})"
    return ""


def _mount_of(line: str) -> tuple[str, str, bool] | None:
    """(mount point, file system type, read-only) of one /proc/self/mountinfo line."""
    fields = line.split()
    try:
        dash = fields.index("-", 6)
        point, options, fstype = fields[4], fields[5], fields[dash + 1]
    except (ValueError, IndexError):
        return None
    point = _unescape(point)
    return os.path.normpath(point), fstype, "ro" in options.split(",")


def _unescape(text: str) -> str:
    r"""Mountinfo writes space, tab, newline and backslash as \ooo octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _pull(
    options: WarmOptions,
    request: WarmRequest,
    result: WarmResult,
    runner: Runner,
    out: Callable[[str], None],
) -> None:
    if not request.images:
        out("peerpods podvm warm: no images to pull")
        return
    reason = volatile_reason(options.store, options.mountinfo)
    if reason:
        result.storage = reason
        result.errors.append(f"image store refused: {reason}")
        out(f"peerpods podvm warm: not pulling: {reason}")
        return
    # the images as arguments, not a file: the image's root (and its /tmp) may be read-only
    argv = [*options.pull_command, "--store", str(options.store)]
    if options.auth is not None and options.auth.is_file():
        argv += ["--auth", str(options.auth)]
    argv += ["--", *request.images]
    out(f"peerpods podvm warm: pulling {len(request.images)} image(s) into {options.store}")
    result.pull_exit = _pull_with_retries(options, argv, runner, out)
    result.stored = stored_images(options.store, request.images)
    for image in request.images:
        out(f"{image}: {'stored' if result.stored.get(image) else 'not stored'}")
    if result.pull_exit == 124:
        result.errors.append(f"the pull ran past {options.pull_timeout_seconds:.0f}s: stopped")
    elif result.pull_exit:
        result.errors.append(f"the pull exited {result.pull_exit}")


def _pull_with_retries(
    options: WarmOptions, argv: Sequence[str], runner: Runner, out: Callable[[str], None]
) -> int:
    """The pull, tried again after a failure while the deadline allows (the network or the
    registry may come up after the unit starts; what was stored is not fetched again)."""
    deadline = time.monotonic() + options.pull_timeout_seconds
    status = 0
    for attempt in range(1, options.pull_attempts + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            return 124
        status = runner(argv, left)
        if status in (0, 2, 124) or attempt == options.pull_attempts:
            return status  # done, bad input (a retry cannot help) or out of time
        pause = min(options.retry_pause_seconds, max(0.0, deadline - time.monotonic()))
        out(f"peerpods podvm warm: the pull exited {status}; again in {pause:.0f}s")
        options.sleep(pause)
    return status


def stored_images(store: Path, images: Sequence[str]) -> dict[str, bool]:
    """Whether each image is in the store now (what the adoption's mirror will serve)."""
    from adaptor.podvm.imagecache.reference import parse
    from adaptor.podvm.imagecache.store import ImageStore, StoreError
    from providers.core.errors import InvalidRequest

    try:
        opened = ImageStore(store)
    except StoreError as exc:
        log.error("%s", exc)
        return dict.fromkeys(images, False)
    found: dict[str, bool] = {}
    for image in images:
        try:
            ref = parse(image)
            manifest = opened.resolve(ref.registry, ref.repository, ref.reference)
        except (InvalidRequest, StoreError):
            manifest = None
        found[image] = manifest is not None
    return found


def _finish(
    options: WarmOptions, result: WarmResult, runner: Runner, out: Callable[[str], None]
) -> None:
    """The status file, cloud-init's state cleaned, sync, power off: each step tried alone."""
    cloud_init = shutil.which(options.cloud_init) if options.cloud_init else None
    if cloud_init:
        # cloud-init's last stage may still be running (it starts after multi-user.target):
        # its state is cleaned once it is done, or it would write some of it back
        waited = runner([cloud_init, "status", "--wait"], 300)
        if waited not in (0, 2):  # 2: done, with recoverable errors
            log.warning("cloud-init status --wait exited %s", waited)
        status = runner([cloud_init, "clean", "--logs"], 120)
        result.cloud_init_cleaned = status == 0
        if status:
            result.errors.append(f"cloud-init clean exited {status}")
    try:
        write_atomic(options.status_path, json.dumps(result.to_dict(), indent=2) + "\n")
    except OSError as exc:
        log.error("%s: %s", options.status_path, exc.strerror or exc)
    os.sync()
    summary = "; ".join(result.errors) if result.errors else "done"
    out(f"peerpods podvm warm: {summary}; powering off")
    status = runner(options.poweroff_command, 60)
    result.powered_off = status == 0
    if status:
        result.errors.append(f"{' '.join(options.poweroff_command)} exited {status}")
