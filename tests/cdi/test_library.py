"""The CDI library on its own: names, version rules stricter than the 0.5.2 reference, priority,
YAML, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptor.cdi import (
    DeviceNameError,
    EditError,
    Registry,
    ResolveError,
    SpecError,
    parse_annotations,
    parse_qualified_name,
    parse_spec,
)
from adaptor.cli.main import main


def spec(version: str = "0.5.0", kind: str = "vendor.com/gpu", **device: Any) -> str:
    dev = {"name": "0", "containerEdits": {"env": ["A=1"]}} | device
    return json.dumps({"cdiVersion": version, "kind": kind, "devices": [dev]})


@pytest.mark.parametrize(
    "name", ["nvidia.com/gpu=0", "a.b-c_d/x_y-z=0:1", "v/c=MIG-abc.1", "v/c.d=x"]
)
def test_qualified_names(name: str) -> None:
    assert str(parse_qualified_name(name)) == name


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "gpu=0",
        "/dev/x=1",
        "1v/c=0",
        "v/c=-0",
        "v/c=a/b",
        "v/c-=0",
        "v/c=0=1",
        "v/é=0",
        "",
    ],
)
def test_bad_qualified_names(name: str) -> None:
    with pytest.raises(DeviceNameError):
        parse_qualified_name(name)


def test_annotations_parse_fails_whole_on_one_bad_name() -> None:
    assert parse_annotations({"cdi.k8s.io/a": "v/c=0,v/c=1", "other": "x"}) == (
        ["cdi.k8s.io/a"],
        ["v/c=0", "v/c=1"],
    )
    with pytest.raises(DeviceNameError, match=r"cdi\.k8s\.io/a"):
        parse_annotations({"cdi.k8s.io/a": "v/c=0, v/c=1"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (spec("0.3.0"), "needs 0.5.0"),  # name starting with a digit
        (
            spec(
                "0.3.0",
                name="a",
                containerEdits={
                    "mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]
                },
            ),
            "mount type",
        ),
        (
            spec(
                "0.4.0",
                name="a",
                containerEdits={"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]},
            ),
            "hostPath",
        ),
        (spec("0.5.0", annotations={"a": "b"}), "annotations"),
        (spec("0.5.0", kind="vendor.com/g.pu"), "class"),
        (spec("0.6.0", containerEdits={"additionalGids": [5]}), "additionalGids"),
        (
            spec("1.0.0", containerEdits={"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}),
            "netDevices",
        ),
        (spec("2.0.0"), "invalid cdiVersion"),
        ('{"cdiVersion": "0.5.0", "cdiVersion": "0.5.0"}', "duplicate key"),
        ("cdiVersion: [", "cannot parse"),
    ],
)
def test_versions_and_syntax_are_strict(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(text, "x.json" if text.startswith("{") else "x.yaml")


def test_newer_features_load_at_their_version(tmp_path: Path) -> None:
    text = spec(
        "1.1.0",
        kind="vendor.com/g.pu",
        annotations={"a": "b"},
        containerEdits={
            "additionalGids": [5, 5, 6],
            "netDevices": [{"hostInterfaceName": "eth1", "name": "net0"}],
        },
    )
    (tmp_path / "s.json").write_text(text)
    oci: dict[str, Any] = {"process": {"user": {"uid": 0, "gid": 0}}}
    Registry([str(tmp_path)]).inject(oci, ["vendor.com/g.pu=0"])
    assert oci["process"]["user"]["additionalGids"] == [5, 6]
    assert oci["linux"]["netDevices"] == {"eth1": {"name": "net0"}}


def test_yaml_and_priority(tmp_path: Path) -> None:
    low, high = tmp_path / "etc", tmp_path / "run"
    low.mkdir()
    high.mkdir()
    (low / "a.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: v.com/c\ndevices:\n"
        "- name: x\n  containerEdits: {env: [A=low]}\n"
        "- name: y\n  containerEdits: {env: [B=low]}\n"
    )
    (high / "b.json").write_text(spec(kind="v.com/c", name="x", containerEdits={"env": ["A=high"]}))
    (high / "ignored.txt").write_text("not a spec")
    registry = Registry([str(low), str(high)])
    assert registry.list_devices() == ["v.com/c=x", "v.com/c=y"]
    oci: dict[str, Any] = {}
    registry.inject(oci, ["v.com/c=x", "v.com/c=y"])
    assert oci["process"]["env"] == ["A=high", "B=low"]
    with pytest.raises(ResolveError, match=r"v\.com/c=z"):
        registry.inject({}, ["v.com/c=z"])


def test_stat_needed_but_refused_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(
        spec(
            containerEdits={
                "env": ["A=1"],
                "deviceNodes": [{"path": "/dev/x", "type": "c", "major": 1}, {"path": "/dev/null"}],
            }
        )
    )
    oci: dict[str, Any] = {"process": {"env": ["A=0"]}}
    with pytest.raises(EditError, match="/dev/null"):
        Registry([str(tmp_path)]).inject(oci, ["vendor.com/gpu=0"], stat=None)
    assert oci == {"process": {"env": ["A=0"]}}


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(
        spec(
            containerEdits={
                "env": ["A=1"],
                "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
            }
        )
    )
    bad.write_text(spec("0.5.0", name="-x"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"ociVersion": "1.0.2", "process": {"env": ["A=0", "B=2"]}}))
    assert main(["cdi", "validate", str(good)]) == 0
    assert main(["cdi", "validate", str(good), str(bad)]) == 1
    assert "-x" in capsys.readouterr().err
    bad.unlink()
    assert main(["cdi", "list", "--spec-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == ["vendor.com/gpu=0"]
    assert (
        main(
            ["cdi", "apply", "--spec-dir", str(tmp_path), "--oci", str(config), "vendor.com/gpu=0"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["process"]["env"] == ["A=1", "B=2"]
    assert out["linux"]["devices"][0]["path"] == "/dev/nvidia0"
    assert (
        main(
            ["cdi", "apply", "--spec-dir", str(tmp_path), "--oci", str(config), "vendor.com/gpu=9"]
        )
        == 2
    )
    assert "unresolvable CDI devices: vendor.com/gpu=9" in capsys.readouterr().err
