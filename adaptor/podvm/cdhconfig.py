"""`podvm cdh-config`: point the guest's image puller at the pre-pulled images, when there are any.

Kata's agent pulls a pod's images through the Confidential Data Hub (CDH, image-rs inside). After
a warm VM's adoption the images it pulled wait in the image store, served read-only on loopback by
`peerpods podvm image-mirror`. This step, run before CDH starts, writes

    /run/peerpods/registries.conf   containers-registries.conf(5): for each registry in the
                                    store one `[[registry]]` whose mirror is the loopback mirror
                                    (`127.0.0.1:5170/<registry>`, plain HTTP); image-rs tries a
                                    registry's mirrors first, then the registry itself
    /run/peerpods/cdh.toml          the operator's CDH configuration (CAA's /run/peerpod/cdh.toml,
                                    from initdata) with `[image] registry_configuration_uri`
                                    naming that file, every other byte as it was; without one,
                                    the configuration CDH would default to (`[kbc] name =
                                    "offline_fs_kbc"`, its own socket) and that image table

and CDH starts with the second (the recipe's drop-in for CAA's confidential-data-hub.service).

With no image in the store nothing is written (what it wrote before is removed) and CDH starts
as CAA starts it. An operator's own registry configuration (`registry_configuration_uri` or an
inline `registry_config`) is theirs: it is kept, nothing of ours is added, and the log says so.
So is one that sets an image security policy: image-rs checks a pull from a mirror against the
policy under the mirror's name, where requirements scoped to the image's registry or repository
would not apply.
An `[image]` table makes image-rs stop reading its settings from the kernel command line
(`agent.image_registry_auth`, `agent.https_proxy`, ...): where the kernel command line sets one
and there is no `[image]` yet, nothing is written either. CAA's image passes none there, and its
unit hands CDH the pull secrets through the environment, which still applies.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from adaptor.podvm.status import write_atomic
from adaptor.toml import edit as tomledit
from adaptor.toml.write import dumps
from adaptor.toml.write import value as toml_value

log = logging.getLogger(__name__)

URI_KEY = "registry_configuration_uri"
INLINE_KEY = "registry_config"
POLICY_KEYS = ("image_security_policy_uri", "image_security_policy")
# what image-rs reads from the kernel command line only while the CDH config has no [image]
CMDLINE_KEYS = (
    "agent.image_registry_auth",
    "agent.enable_signature_verification",
    "agent.image_policy_file",
    "agent.https_proxy",
    "agent.http_proxy",
    "agent.no_proxy",
)
MARK = "# added by peerpods podvm cdh-config"
# what CDH runs with when it is given no configuration file (its kbc defaults to this one)
DEFAULT_KBC = {"name": "offline_fs_kbc", "url": ""}


class CdhConfigError(ValueError):
    """The operator's CDH configuration cannot be extended (names the file and the problem)."""


@dataclass(frozen=True)
class Declined:
    """Why the operator's CDH configuration is left as it is."""

    why: str


@dataclass(frozen=True)
class CdhOptions:
    """Where `cdh-config` reads and writes; built from `peerpods podvm cdh-config`'s settings
    (`adaptor.cli.settings.PodvmCdhConfigSettings`), whose defaults are a CAA pod VM's paths."""

    store: Path
    operator_config: Path
    registries_conf: Path
    cdh_config: Path
    mirror_address: str = "127.0.0.1:5170"
    cmdline: Path = Path("/proc/cmdline")


@dataclass(frozen=True)
class CdhResult:
    """What one run wrote (None: nothing) and why."""

    registries: tuple[str, ...]
    written: tuple[Path, ...]
    note: str


def registries_conf(mirrors: Mapping[str, str]) -> str:
    """containers-registries.conf(5) text: per registry (the key) its mirror location (the
    value), over plain HTTP (`insecure`: the mirror listens on loopback without TLS)."""
    lines = [
        "# written by peerpods podvm cdh-config: the pre-pulled images, served on loopback,",
        "# are tried before each image's registry",
    ]
    for prefix in sorted(mirrors):
        lines += [
            "",
            "[[registry]]",
            f"prefix = {toml_value(prefix)}",
            "",
            "[[registry.mirror]]",
            f"location = {toml_value(mirrors[prefix])}",
            "insecure = true",
        ]
    text = "\n".join(lines) + "\n"
    read = tomllib.loads(text)  # what image-rs will read, checked before anything is written
    if [r["prefix"] for r in read.get("registry", [])] != sorted(mirrors):
        raise CdhConfigError(f"registries {sorted(mirrors)} do not read back as written")
    return text


def cdh_toml(
    operator_text: str | None, uri: str, where: str = "cdh.toml", cmdline: str = ""
) -> str | Declined:
    """The CDH configuration naming `uri` as its registry configuration: the operator's text with
    the key added, or the default configuration; Declined (why) when it is not to be extended.
    `cmdline` is the kernel's: image settings there are read only while there is no [image]."""
    given = {word.split("=", 1)[0] for word in cmdline.split()}
    overridden = [key for key in CMDLINE_KEYS if key in given]
    if operator_text is None:
        if overridden:
            why = f"is absent and the kernel command line sets {overridden[0]}"
            return Declined(f"{why}, which an [image] table would hide: left to CDH")
        return MARK + "\n" + dumps({"kbc": DEFAULT_KBC, "image": {URI_KEY: uri}})
    try:
        document = tomllib.loads(operator_text)
    except tomllib.TOMLDecodeError as exc:
        raise CdhConfigError(f"{where}: not TOML: {exc}") from None
    image = document.get("image", {})
    if not isinstance(image, dict):
        raise CdhConfigError(f"{where}: image is not a table")
    if "image" not in document and overridden:
        why = f"has no [image] and the kernel command line sets {overridden[0]}"
        return Declined(f"{why}, which an [image] table would hide: kept")
    if URI_KEY in image or INLINE_KEY in image:
        return Declined("names its own registry configuration: kept")
    policy = [key for key in POLICY_KEYS if key in image]
    if policy:
        # image-rs checks a pull from a mirror against the policy under the mirror's name
        # (127.0.0.1:5170/<registry>/...), where the policy's requirements scoped to the image's
        # registry or repository do not apply: a policy is never weakened for a faster pull
        return Declined(f"sets an image security policy ({policy[0]}): kept")
    try:
        return tomledit.apply(operator_text, [tomledit.Edit(("image",), URI_KEY, uri)], MARK)
    except tomledit.TomlEditError as exc:
        raise CdhConfigError(f"{where}: cannot add image.{URI_KEY}: {exc}") from None


def configure_cdh(options: CdhOptions) -> CdhResult:
    """Write (or remove) both files for the images in the store now."""
    registries = store_registries(options.store)
    if not registries:
        removed = _remove(options.registries_conf, options.cdh_config)
        note = f"no image in {options.store}: CDH keeps its own configuration"
        log.info("%s%s", note, " (earlier files removed)" if removed else "")
        return CdhResult((), (), note)
    from adaptor.podvm.imagecache.mirror import mirror_location

    try:
        operator_text: str | None = options.operator_config.read_text(encoding="utf-8")
    except FileNotFoundError:
        operator_text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise CdhConfigError(f"{options.operator_config}: {exc}") from None
    uri = options.registries_conf.resolve().as_uri()
    try:
        cmdline = options.cmdline.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CdhConfigError(f"{options.cmdline}: {exc.strerror or exc}") from None
    text = cdh_toml(operator_text, uri, str(options.operator_config), cmdline)
    if isinstance(text, Declined):
        _remove(options.registries_conf, options.cdh_config)
        note = (
            f"{options.operator_config} {text.why}, and the pre-pulled images of "
            f"{', '.join(registries)} are not offered to CDH"
        )
        log.warning("%s", note)
        return CdhResult(registries, (), note)
    mirrors = {r: mirror_location(r, options.mirror_address) for r in registries}
    write_atomic(options.registries_conf, registries_conf(mirrors))
    write_atomic(options.cdh_config, text, mode=0o600)
    base = f"{options.operator_config}" if operator_text is not None else "CDH's defaults"
    note = f"CDH pulls {', '.join(registries)} through the mirror first ({base} extended)"
    log.info("%s", note)
    return CdhResult(registries, (options.registries_conf, options.cdh_config), note)


def store_registries(store: Path) -> tuple[str, ...]:
    """The registries the store holds images of; none when there is no store."""
    if not (store / "index.json").is_file():
        return ()  # no store, or one that never recorded an image: not opened (nor created)
    from adaptor.podvm.imagecache.store import ImageStore

    return tuple(ImageStore(store).registries())


def _remove(*paths: Path) -> bool:
    removed = False
    for path in paths:
        try:
            path.unlink()
            removed = True
        except FileNotFoundError:
            pass
    return removed
