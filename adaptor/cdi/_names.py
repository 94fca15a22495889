"""Qualified CDI device names (`vendor/class=name`) and the `cdi.k8s.io/*` request annotations.

The rules are the CDI spec's: vendor and class start with a letter and end with a letter or digit;
inside, vendor allows `_ . -` and class `_ -` (a `.` in the class needs cdiVersion 0.6.0, so it is
allowed here and checked against the version by the spec loader); a device name starts and ends
alphanumeric with `_ . - :` inside. Only ASCII letters and digits count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from adaptor.cdi._errors import DeviceNameError

ANNOTATION_PREFIX = "cdi.k8s.io/"
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VENDOR_INNER = _ALNUM | frozenset("_.-")
_CLASS_INNER = _ALNUM | frozenset("_.-")
_NAME_INNER = _ALNUM | frozenset("_.-:")


class QualifiedName(NamedTuple):
    """A parsed `vendor/class=name`."""

    vendor: str
    class_: str
    name: str

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.class_}"

    def __str__(self) -> str:
        return f"{self.vendor}/{self.class_}={self.name}"


def _check(value: str, what: str, first: frozenset[str], inner: frozenset[str]) -> None:
    if not value:
        raise DeviceNameError(f"invalid (empty) {what}")
    if value[0] not in first:
        need = "a letter" if first is _LETTERS else "a letter or digit"
        raise DeviceNameError(f"invalid {what} {value!r}: must start with {need}")
    for char in value[1:-1]:
        if char not in inner:
            raise DeviceNameError(f"invalid character {char!r} in {what} {value!r}")
    if value[-1] not in _ALNUM:
        raise DeviceNameError(f"invalid {what} {value!r}: must end with a letter or digit")


def validate_vendor(vendor: str) -> None:
    _check(vendor, "vendor name", _LETTERS, _VENDOR_INNER)


def validate_class(class_: str) -> None:
    _check(class_, "device class", _LETTERS, _CLASS_INNER)


def validate_device_name(name: str) -> None:
    _check(name, "device name", _ALNUM, _NAME_INNER)


def parse_kind(kind: str) -> tuple[str, str]:
    """`vendor/class` -> (vendor, class), both validated."""
    vendor, sep, class_ = kind.partition("/")
    if not sep or not vendor or not class_:
        raise DeviceNameError(f"invalid kind {kind!r}: want vendor/class")
    validate_vendor(vendor)
    validate_class(class_)
    return vendor, class_


def parse_qualified_name(device: str) -> QualifiedName:
    """`vendor/class=name` -> QualifiedName; raises DeviceNameError saying what is wrong."""
    kind, sep, name = device.partition("=")
    if not sep or not kind or not name or device.startswith("/") or "/" not in kind:
        raise DeviceNameError(f"unqualified device {device!r}: want vendor/class=name")
    try:
        vendor, class_ = parse_kind(kind)
        validate_device_name(name)
    except DeviceNameError as exc:
        raise DeviceNameError(f"invalid device {device!r}: {exc}") from None
    return QualifiedName(vendor, class_, name)


def is_qualified_name(device: str) -> bool:
    try:
        parse_qualified_name(device)
    except DeviceNameError:
        return False
    return True


def annotation_value(devices: Iterable[str]) -> str:
    """The comma-separated value of a `cdi.k8s.io/*` annotation; every name is validated."""
    names = list(devices)
    for device in names:
        parse_qualified_name(device)
    return ",".join(names)


def parse_annotations(annotations: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(keys, devices) requested by `cdi.k8s.io/*` annotations; one bad name fails the parse."""
    keys: list[str] = []
    devices: list[str] = []
    for key, value in annotations.items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        for device in value.split(","):
            if not is_qualified_name(device):
                raise DeviceNameError(f"annotation {key}: invalid CDI device name {device!r}")
            devices.append(device)
        keys.append(key)
    return keys, devices
