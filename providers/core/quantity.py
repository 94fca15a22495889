"""Kubernetes resource quantities (`16Gi`, `500m`, `1.5`, `2e3`) as exact numbers."""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

from providers.core.errors import InvalidRequest

_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
MIB = Decimal(2) ** 20
# Kubernetes caps a quantity's magnitude at 2^63-1; so do we, before any huge number is built
# (1e999999 would otherwise cost seconds of CPU as an integer).
MAX_QUANTITY = Decimal(2**63 - 1)


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity; InvalidRequest for anything Kubernetes would reject."""
    return parse_capped(value)[0]


def parse_capped(value: str | int | float) -> tuple[Decimal, bool]:
    """The value of a quantity capped at 2^63-1, and whether it was capped: Kubernetes keeps
    such a quantity but will not convert it to an int64 (CEL's `asInteger` fails on it)."""
    found = _parse(value)
    return min(found, MAX_QUANTITY), found > MAX_QUANTITY


def _parse(value: str | int | float) -> Decimal:
    if isinstance(value, bool):
        raise InvalidRequest(f"invalid quantity {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"invalid quantity {value!r}")
        if value < 0:
            raise InvalidRequest(f"negative quantity {value!r}")
        return Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise InvalidRequest(f"invalid quantity {_short(text)}")
    number, suffix = match.groups()
    if number.lstrip("+-").startswith(".") is False and number.count(".") > 1:
        raise InvalidRequest(f"invalid quantity {_short(text)}")
    try:
        mantissa = Decimal(number)
        if mantissa < 0:
            raise InvalidRequest(f"negative quantity {_short(text)}")
        if mantissa and mantissa.adjusted() > 40:
            return MAX_QUANTITY + 1  # far beyond the cap: never built as a huge number
        result = mantissa * _SUFFIX[suffix]
    except DecimalException:
        raise InvalidRequest(f"invalid quantity {_short(text)}") from None
    return result


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def to_mib(value: str | int | float) -> int:
    """Bytes quantity -> MiB, rounded up (a request is a minimum)."""
    return math.ceil(parse_quantity(value) / MIB)


def to_cpus(value: str | int | float) -> int:
    """CPU quantity -> whole vCPUs, rounded up."""
    return math.ceil(parse_quantity(value))
