"""CEL runtime errors are errors, as Kubernetes' CEL libraries and DRA allocator have them.

Sources: Kubernetes' quantity library (k8s.io/apiserver pkg/cel/library/quantity.go, listed in
https://kubernetes.io/docs/reference/using-api/cel/): `asInteger` "returns an error if the
value cannot be represented as an int64", `isInteger` is true "if and only if asInteger is safe
to call without an error"; resource.Quantity caps a parsed magnitude at 2^63-1 but keeps it as a
big decimal, which is not an int64. The semver library parses Semantic Versioning 2.0.0
(https://semver.org: no leading zeros, pre-release precedence, build metadata ignored). The DRA
allocator (k8s.io/dynamic-resource-allocation structured allocator) evaluates a device's
selectors in order, the class's first, and a runtime error fails the claim's allocation
("CEL runtime error"), whatever the other devices gave.
"""

from __future__ import annotations

import pytest

from providers.core.catalog import Catalog
from webhook._cel import CelError, compile_selector, evaluate
from webhook._devices import DeviceSpace


def _run(expression: str) -> bool:
    return evaluate(compile_selector(expression), {})


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("quantity('1e999999').asInteger() > 0", "does not fit an int64"),
        ("quantity('9223372036854775807').add(1).asInteger() > 0", "does not fit an int64"),
        ("quantity('1.5').asInteger() == 1", "is not an integer"),
        ("semver('01.0.0').major() == 1", "not a semantic version"),
        ("semver('1.0').major() == 1", "not a semantic version"),
        ("semver('1.0.0-!!').major() == 1", "not a semantic version"),
        ("quantity('ten').sign() == 1", "not a valid quantity"),
    ],
)
def test_library_runtime_errors_are_errors_not_values(expression: str, error: str) -> None:
    with pytest.raises(CelError, match=error) as caught:
        _run(expression)
    assert caught.value.public.startswith(error.split()[0]) or error in caught.value.public


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("quantity('1e999999').isInteger()", False),  # asInteger would fail
        ("quantity('9223372036854775807').isInteger()", True),
        ("quantity('9223372036854775807').asInteger() == 9223372036854775807", True),
        # capped as resource.Quantity caps it, for comparisons
        ("quantity('1e999999') == quantity('9223372036854775807')", True),
        ("quantity('9223372036854775807').add(1).isGreaterThan(quantity('1e999999'))", True),
        ("isSemver('1.0.0-alpha.1+build.5')", True),
        ("isSemver('1.0.0-01')", False),  # numeric pre-release identifiers: no leading zero
        ("isSemver('1.2')", False),
        ("semver('1.0.0-alpha').isLessThan(semver('1.0.0'))", True),
        ("semver('1.0.0-alpha.1').isLessThan(semver('1.0.0-alpha.beta'))", True),
        ("semver('1.0.0-alpha.2').isLessThan(semver('1.0.0-alpha.10'))", True),
        ("semver('1.0.0+a') == semver('1.0.0+b')", True),
        ("semver('1.0.0-rc.1').compareTo(semver('1.0.0-rc.1')) == 0", True),
    ],
)
def test_library_values_match_kubernetes(expression: str, expected: bool) -> None:
    assert _run(expression) is expected


def test_a_selector_that_errors_on_a_candidate_device_fails_the_claim(catalog: Catalog) -> None:
    """`profile` exists only on MIG devices: read unguarded on whole GPUs it is a runtime
    error, so Kubernetes fails the allocation; the denial names the selector and the error."""
    space = DeviceSpace(catalog)
    selector = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    with pytest.raises(CelError) as caught:
        space.match([("selector 1 of request gpu", selector)])
    message = str(caught.value)
    assert message.startswith("selector 1 of request gpu: CEL runtime error: no such")
    assert selector not in message  # the expression itself is never quoted


def test_a_selector_is_evaluated_only_on_devices_earlier_selectors_admit(
    catalog: Catalog,
) -> None:
    """The class admits MIG devices only, so the request's `profile` read never meets a whole
    GPU: no error, and exactly the 1g.10gb devices match."""
    space = DeviceSpace(catalog)
    match, error = space.match(
        [
            ("selector 1 of DeviceClass mig.nvidia.com",
             "device.attributes['gpu.nvidia.com'].type == 'mig'"),
            ("selector 1 of request mig",
             "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"),
        ]
    )  # fmt: skip
    assert error == ""
    assert match.devices and {d.profile for d in match.devices} == {"1g.10gb"}


def test_a_guarded_read_is_no_error(catalog: Catalog) -> None:
    space = DeviceSpace(catalog)
    match, error = space.match(
        [
            ("selector 1 of request gpu",
             "'profile' in device.attributes['gpu.nvidia.com'] && "
             "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"),
        ]
    )  # fmt: skip
    assert error == "" and {d.profile for d in match.devices} == {"1g.10gb"}
