"""CEL for DRA selectors: cel-python plus the Kubernetes extension functions DRA selectors use.

Kubernetes adds to CEL a `quantity` type (`quantity('40Gi')`, `isQuantity`, `compareTo`,
`isGreaterThan`, `isLessThan`, `add`, `sub`, `asInteger`, `asApproximateFloat`, `isInteger`,
`sign`) and a `semver` type for version attributes (`semver('8.0.0')`, `isSemver`, `major`,
`minor`, `patch`, `compareTo`, `isGreaterThan`, `isLessThan`). cel-python knows neither, so they
are defined here as plain functions (CEL's `a.f(b)` calls `f(a, b)`). Programs are compiled once
per expression and cached.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from providers.errors import InvalidRequest
from providers.quantity import parse_quantity

__all__ = ["CelError", "Quantity", "Semver", "compile_selector", "evaluate"]


class CelError(InvalidRequest):
    """A selector that does not compile, or that cannot be evaluated."""


class Quantity:
    """A Kubernetes quantity as a CEL value (exact, compared by value)."""

    __slots__ = ("value",)

    def __init__(self, value: Decimal) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.value})"


_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:[-+].*)?$")


class Semver:
    """A semantic version as a CEL value (the type of version attributes)."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[int, int, int]) -> None:
        self.parts = parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)

    def __repr__(self) -> str:
        return "Semver({}.{}.{})".format(*self.parts)


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)))
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except InvalidRequest:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: Any) -> Semver:
    match = _SEMVER.match(str(text))
    if not match:
        raise ValueError(f"invalid semver {text!r}")
    return Semver((int(match[1]), int(match[2]), int(match[3])))


def _is_semver(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(bool(_SEMVER.match(str(text))))


def _key(value: Any) -> Any:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, Semver):
        return value.parts
    raise TypeError(f"no comparison for {type(value).__name__}")


def _compare(a: Any, b: Any) -> celtypes.IntType:
    if type(a) is not type(b):
        raise TypeError(f"cannot compare {type(a).__name__} with {type(b).__name__}")
    ka, kb = _key(a), _key(b)
    return celtypes.IntType((ka > kb) - (ka < kb))


def _greater(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_compare(a, b) > 0)


def _less(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_compare(a, b) < 0)


def _operand(value: Any) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int):
        return Decimal(int(value))
    raise TypeError(f"expected a quantity or int, got {type(value).__name__}")


def _add(a: Quantity, b: Any) -> Quantity:
    return Quantity(_operand(a) + _operand(b))


def _sub(a: Quantity, b: Any) -> Quantity:
    return Quantity(_operand(a) - _operand(b))


def _as_integer(a: Quantity) -> celtypes.IntType:
    if a.value != a.value.to_integral_value():
        raise ValueError(f"quantity {a.value} is not an integer")
    return celtypes.IntType(int(a.value))


def _as_float(a: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(a.value))


def _is_integer(a: Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(a.value == a.value.to_integral_value())


def _sign(a: Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > 0) - (a.value < 0))


def _part(index: int) -> Any:
    def get(v: Semver) -> celtypes.IntType:
        return celtypes.IntType(v.parts[index])

    return get


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": _greater,
    "isLessThan": _less,
    "add": _add,
    "sub": _sub,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_float,
    "isInteger": _is_integer,
    "sign": _sign,
    "major": _part(0),
    "minor": _part(1),
    "patch": _part(2),
}

_ENV = celpy.Environment()
_MAX_EXPRESSION = 10_240  # Kubernetes' limit on a selector expression, bytes


@functools.lru_cache(maxsize=512)
def compile_selector(expression: str) -> celpy.Runner:
    """The compiled program of one selector (cached); CelError when it does not compile."""
    if len(expression.encode()) > _MAX_EXPRESSION:
        raise CelError(f"CEL expression longer than {_MAX_EXPRESSION} bytes")
    try:
        ast = _ENV.compile(expression)
        return _ENV.program(ast, functions=FUNCTIONS)
    except CELParseError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise CelError(f"invalid CEL expression {expression!r}: {first}") from None


def evaluate(program: celpy.Runner, activation: dict[str, Any]) -> bool:
    """True or False; CelError for a runtime error or a non-boolean result."""
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        raise CelError(_eval_message(exc)) from None
    except (ValueError, TypeError, ArithmeticError, KeyError) as exc:
        raise CelError(str(exc)) from None
    if not isinstance(result, celtypes.BoolType):
        raise CelError(f"selector returned {type(result).__name__}, not a bool")
    return bool(result)


def _eval_message(exc: CELEvalError) -> str:
    args = exc.args
    text = str(args[0]) if args else "evaluation failed"
    detail = args[2] if len(args) > 2 else None
    if text == "no such key" and detail:
        return f"no such key {detail[0]!s}"
    return text.split(" (in activation", 1)[0]
