"""The CDI library against the reference Go implementation (Debian's 0.5.2): generated specs and
OCI specs, applied by both, give the same result; specs invalid for one are invalid for both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor.cdi import CdiError, Registry
from tests.cdi.conftest import Oracle
from tests.cdi.strategies import MUTATIONS, cdi_spec, oci_spec

pytestmark = pytest.mark.go
BASE_OCI = {"ociVersion": "1.0.2", "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/"}}
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def normalise(doc: Any) -> Any:
    """Compare as the reference's JSON would: empty values dropped, env by effective value (the
    packaged reference appends a duplicate key where the spec replaces it; the last one wins)."""
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            if key == "env" and isinstance(value, list):
                effective: dict[str, str] = {}
                for item in value:
                    k, _, v = item.partition("=")
                    effective[k] = v
                value = effective
            value = normalise(value)
            if value not in (None, "", [], {}):
                out[key] = value
        return out
    if isinstance(doc, list):
        return [normalise(v) for v in doc]
    return doc


def run_python(
    tmp: Path, specs: dict[str, str], oci: dict[str, Any], devices: list[str]
) -> dict[str, Any]:
    for old in tmp.iterdir():
        old.unlink()
    for name, text in specs.items():
        (tmp / name).write_text(text)
    registry = Registry([str(tmp)])
    result: dict[str, Any] = {
        "devices": registry.list_devices(),
        "spec_errors": {Path(p).name: e[0] for p, e in registry.errors.items()},
    }
    try:
        result["oci"] = registry.inject(json.loads(json.dumps(oci)), devices)
    except CdiError as exc:
        result["error"] = str(exc)
    return result


def compare(
    oracle: Oracle, tmp: Path, specs: dict[str, str], oci: dict[str, Any], devices: list[str]
) -> dict[str, Any]:
    go = oracle(specs, oci, devices)
    py = run_python(tmp, specs, oci, devices)
    assert "panic" not in go.get("error", ""), go
    assert sorted(py["spec_errors"]) == sorted(go["spec_errors"]), (py, go)
    assert py["devices"] == (go["devices"] or []), (py, go)
    assert ("error" in py) == ("error" in go), (py.get("error"), go.get("error"))
    if "error" not in go:
        assert normalise(py["oci"]) == normalise(go["oci"])
    return py


@st.composite
def case(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    docs = draw(st.lists(cdi_spec(), min_size=1, max_size=3))
    specs = {f"spec{i}.json": json.dumps(d) for i, d in enumerate(docs)}
    available = [f"{d['kind']}={dev['name']}" for d in docs for dev in d["devices"]]
    devices = draw(st.lists(st.sampled_from(available), min_size=1, max_size=4))
    if draw(st.integers(0, 9)) == 0:
        devices.append("vendor.com/gpu=missing")
    return specs, draw(oci_spec()), devices


@SETTINGS
@given(case())
def test_same_result_as_reference(
    oracle: Oracle, tmp_path: Path, c: tuple[dict[str, str], dict[str, Any], list[str]]
) -> None:
    specs, oci, devices = c
    compare(oracle, tmp_path, specs, oci, devices)


@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@given(doc=cdi_spec())
def test_invalid_specs_rejected_by_both(
    oracle: Oracle, tmp_path: Path, mutation: str, doc: dict[str, Any]
) -> None:
    good = {"good.json": json.dumps(doc)}
    bad = {"bad.json": json.dumps(MUTATIONS[mutation](doc))}
    devices = [f"{doc['kind']}={doc['devices'][0]['name']}"]
    py = compare(oracle, tmp_path, bad, BASE_OCI, devices)
    assert "bad.json" in py["spec_errors"] and "error" in py
    compare(oracle, tmp_path, good, BASE_OCI, devices)


def test_same_priority_conflict_drops_both(oracle: Oracle, tmp_path: Path) -> None:
    one = {
        "cdiVersion": "0.5.0",
        "kind": "vendor.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"env": ["A=1"]}},
            {"name": "1", "containerEdits": {"env": ["B=1"]}},
        ],
    }
    two = {
        "cdiVersion": "0.5.0",
        "kind": "vendor.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"env": ["A=2"]}}],
    }
    specs = {"a.json": json.dumps(one), "b.yaml": json.dumps(two)}
    py = compare(oracle, tmp_path, specs, BASE_OCI, ["vendor.com/gpu=0"])
    assert py["devices"] == ["vendor.com/gpu=1"] and "error" in py
    compare(oracle, tmp_path, specs, BASE_OCI, ["vendor.com/gpu=1"])
