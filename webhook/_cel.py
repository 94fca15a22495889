"""CEL for DRA selectors: cel-python plus the Kubernetes extension functions DRA selectors use.

Kubernetes adds to CEL a `quantity` type (`quantity('40Gi')`, `isQuantity`, `compareTo`,
`isGreaterThan`, `isLessThan`, `add`, `sub`, `asInteger`, `asApproximateFloat`, `isInteger`,
`sign`) and a `semver` type for version attributes (`semver('8.0.0')`, `isSemver`, `major`,
`minor`, `patch`, `compareTo`, `isGreaterThan`, `isLessThan`). cel-python knows neither, so they
are defined here as plain functions (CEL's `a.f(b)` calls `f(a, b)`). Programs are compiled once
per expression and cached.

Every evaluation is metered, as Kubernetes meters DRA selectors: each evaluated node of the
expression costs 1 and the extension functions cost by the size of what they touch; one selector
evaluated against one device may spend at most `COST_LIMIT` (Kubernetes'
`CELSelectorExpressionMaxCost`, 1,000,000). A `Meter` may also carry a monotonic deadline,
checked every few hundred steps. Either limit ends the evaluation with `CelBudgetExceeded`. A
single slow builtin call cannot be interrupted in-process; the webhook server therefore
evaluates in worker processes it can kill (`_celworker.py`).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator

from providers.core.errors import InvalidRequest
from providers.core.quantity import parse_capped, parse_quantity

__all__ = [
    "COST_LIMIT",
    "CelBudgetExceeded",
    "CelError",
    "Meter",
    "Quantity",
    "Semver",
    "compile_selector",
    "evaluate",
]

COST_LIMIT = 1_000_000  # Kubernetes' CELSelectorExpressionMaxCost, per selector and device
_MAX_QUANTITY = Decimal(2**63 - 1)  # Kubernetes caps a quantity's magnitude here


class CelError(InvalidRequest):
    """A selector that does not compile, or that cannot be evaluated. `public` says what went
    wrong without quoting the expression or its values (what a denial may carry)."""

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public


class CelBudgetExceeded(CelError):
    """An evaluation that spent its cost budget or ran past its deadline."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


# CEL's own evaluation errors that quote nothing of the expression after these words
# The Kubernetes library functions' runtime errors: fixed texts that quote no value.
_WIDE = "asInteger: the quantity does not fit an int64"
_FRACTION = "asInteger: the quantity is not an integer"
_BAD_SEMVER = "semver: not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])"
_BAD_QUANTITY = "quantity: not a valid quantity"
_LIBRARY_ERRORS = (_WIDE, _FRACTION, _BAD_SEMVER, _BAD_QUANTITY)
_PUBLIC_EVAL_ERRORS = (
    *_LIBRARY_ERRORS,
    "no such key",
    "no such member",
    "no such overload",
    "found no matching overload",
    "divide by zero",
    "modulus by zero",
    "return error for overflow",
)


class _Exhausted(Exception):
    """Raised inside an evaluation to leave it at once (celpy turns no such class into a value)."""

    def __init__(self, timed_out: bool) -> None:
        super().__init__("time" if timed_out else "cost")
        self.timed_out = timed_out


class Meter:
    """The cost spent by one evaluation and the deadline it must finish by."""

    __slots__ = ("_tick", "deadline", "limit", "used")

    def __init__(self, limit: int = COST_LIMIT, deadline: float | None = None) -> None:
        self.limit = limit
        self.deadline = deadline  # time.monotonic() value, or None
        self.used = 0
        self._tick = 0

    def charge(self, units: int) -> None:
        self.used += units
        if self.used > self.limit:
            raise _Exhausted(timed_out=False)
        self._tick += units
        if self._tick >= 256 and self.deadline is not None:
            self._tick = 0
            if time.monotonic() > self.deadline:
                raise _Exhausted(timed_out=True)


_local = threading.local()


def _charge(units: int) -> None:
    meter: Meter | None = getattr(_local, "meter", None)
    if meter is not None:
        meter.charge(units)


def _size_cost(*values: Any) -> int:
    """What a function call costs: 1, plus a tenth of the length of any string it reads."""
    return 1 + sum(len(v) // 10 for v in values if isinstance(v, str))


class _Metered(Evaluator):
    """celpy's tree-walking evaluator, charging its meter one unit per node visited."""

    def __init__(self, ast: Any, activation: Any, meter: Meter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _Metered(ast, self.activation, self.meter)

    def _visit_tree(self, tree: Any) -> Any:
        self.meter.charge(1)
        return super()._visit_tree(tree)


class Quantity:
    """A Kubernetes quantity as a CEL value (exact, compared by value). `wide`: its value does
    not fit an int64 (capped at 2^63-1 for comparisons, as Kubernetes caps it), so `asInteger`
    is a runtime error and `isInteger` false, as in Kubernetes' quantity library."""

    __slots__ = ("value", "wide")

    def __init__(self, value: Decimal, wide: bool = False) -> None:
        self.wide = wide or abs(value) > _MAX_QUANTITY
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.value})"


# Semantic Versioning 2.0.0, strictly (as Kubernetes' semver library parses): no leading zeros,
# pre-release and build identifiers of [0-9A-Za-z-], numeric pre-release identifiers without
# leading zeros.
_NUM = r"(?:0|[1-9][0-9]*)"
_PRE_ID = rf"(?:{_NUM}|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
_SEMVER = re.compile(
    rf"^({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?(?:\+{_BUILD_ID}(?:\.{_BUILD_ID})*)?$"
)


class Semver:
    """A semantic version as a CEL value (the type of version attributes), ordered by semver
    precedence: a pre-release ranks below its release, build metadata is ignored."""

    __slots__ = ("parts", "pre")

    def __init__(self, parts: tuple[int, int, int], pre: tuple[str, ...] = ()) -> None:
        self.parts = parts
        self.pre = pre

    @property
    def key(self) -> tuple[object, ...]:
        """Precedence: numeric identifiers below alphanumeric ones, a release above them all."""
        if not self.pre:
            return (*self.parts, 1, ())
        ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (*self.parts, 0, ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        pre = "-" + ".".join(self.pre) if self.pre else ""
        return "Semver({}.{}.{}".format(*self.parts) + pre + ")"


def _quantity(text: Any) -> Quantity:
    _charge(_size_cost(text))
    try:
        value, capped = parse_capped(str(text))
    except InvalidRequest:
        raise ValueError(_BAD_QUANTITY) from None
    # as Kubernetes does: a magnitude beyond 2^63-1 is capped (and marked: asInteger fails)
    return Quantity(value, capped)


def _is_quantity(text: Any) -> celtypes.BoolType:
    _charge(_size_cost(text))
    try:
        parse_quantity(str(text))
    except InvalidRequest:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: Any) -> Semver:
    _charge(_size_cost(text))
    match = _SEMVER.fullmatch(str(text))
    if not match:
        raise ValueError(_BAD_SEMVER)
    pre = tuple(match[4].split(".")) if match[4] else ()
    return Semver((int(match[1]), int(match[2]), int(match[3])), pre)


def _is_semver(text: Any) -> celtypes.BoolType:
    _charge(_size_cost(text))
    return celtypes.BoolType(bool(_SEMVER.fullmatch(str(text))))


def _key(value: Any) -> Any:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, Semver):
        return value.key
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


def _wide(*values: Any) -> bool:
    return any(isinstance(v, Quantity) and v.wide for v in values)


def _add(a: Quantity, b: Any) -> Quantity:
    return Quantity(_operand(a) + _operand(b), _wide(a, b))


def _sub(a: Quantity, b: Any) -> Quantity:
    return Quantity(_operand(a) - _operand(b), _wide(a, b))


def _as_integer(a: Quantity) -> celtypes.IntType:
    if a.wide:
        raise ValueError(_WIDE)
    if a.value != a.value.to_integral_value():
        raise ValueError(_FRACTION)
    return celtypes.IntType(int(a.value))


def _as_float(a: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(a.value))


def _is_integer(a: Quantity) -> celtypes.BoolType:
    """True exactly when asInteger would not fail (Kubernetes' definition)."""
    return celtypes.BoolType(not a.wide and a.value == a.value.to_integral_value())


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


def _metered(function: Any) -> Any:
    @functools.wraps(function)
    def call(*args: Any) -> Any:
        _charge(_size_cost(*args))
        return function(*args)

    return call


# Functions the selectors may call, each charging at least one unit per call.
_METERED = {
    name: (f if name in ("quantity", "isQuantity", "semver", "isSemver") else _metered(f))
    for name, f in FUNCTIONS.items()
}


@functools.lru_cache(maxsize=512)
def compile_selector(expression: str) -> celpy.Runner:
    """The compiled program of one selector (cached); CelError when it does not compile."""
    if len(expression.encode()) > _MAX_EXPRESSION:
        raise CelError(f"CEL expression longer than {_MAX_EXPRESSION} bytes")
    try:
        ast = _ENV.compile(expression)
        return _ENV.program(ast, functions=_METERED)
    except CELParseError as exc:
        # the position only: the parser's message quotes the expression, and a denial must not
        # carry a selector's text to whoever sent the review
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f" at line {line}, column {column}" if line is not None else ""
        raise CelError(f"invalid CEL expression (syntax error{where})") from None
    except RecursionError:
        raise CelError("CEL expression nested too deeply") from None


def evaluate(program: celpy.Runner, activation: dict[str, Any], meter: Meter | None = None) -> bool:
    """True or False; CelError for a runtime error or a non-boolean result, CelBudgetExceeded
    when the evaluation spends more than its meter allows (COST_LIMIT by default)."""
    meter = meter or Meter()
    _local.meter = meter
    try:
        evaluator = _Metered(program.ast, program.new_activation(), meter)
        result = evaluator.evaluate(activation)
    except _Exhausted as exc:
        if exc.timed_out:
            raise CelBudgetExceeded("ran past its time limit", timed_out=True) from None
        raise CelBudgetExceeded(
            f"exceeds the CEL cost limit of {meter.limit} per device "
            "(as Kubernetes limits DRA selectors)"
        ) from None
    except RecursionError:
        raise CelError("expression nested too deeply to evaluate") from None
    except CELEvalError as exc:
        message = _eval_message(exc)
        known = next((p for p in _PUBLIC_EVAL_ERRORS if message.startswith(p)), "")
        raise CelError(message, public=known or "evaluation error") from None
    except (ValueError, TypeError, ArithmeticError, KeyError) as exc:
        raise CelError(str(exc), public=f"evaluation error ({type(exc).__name__})") from None
    finally:
        _local.meter = None
    if not isinstance(result, celtypes.BoolType):
        raise CelError(f"selector returned {type(result).__name__}, not a bool")
    return bool(result)


def _eval_message(exc: CELEvalError) -> str:
    args = exc.args
    text = str(args[0]) if args else "evaluation failed"
    detail = args[2] if len(args) > 2 else None
    if text == "no such key" and detail:
        return f"no such key {detail[0]!s}"
    if text == "return error for overflow" and detail and str(detail[0]) in _LIBRARY_ERRORS:
        return str(detail[0])  # celpy's words for any ValueError a function raises
    return text.split(" (in activation", 1)[0]
