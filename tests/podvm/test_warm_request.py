"""The warm request's one format (`adaptor.podvm.warmrequest`): what the warm pool writes into a
warm VM's apf.json is what the pod VM reads back; a pod's apf.json carries none; bad input is a
clear error on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptor.cli.main import main
from adaptor.podvm.warmrequest import (
    WARM_KEY,
    MalformedWarmRequest,
    WarmRequestError,
    apf_document,
    read_request,
)
from adaptor.settings._warmpool import WarmPoolSettings


def test_what_the_pool_writes_the_vm_reads_back(tmp_path: Path) -> None:
    apf = tmp_path / "apf.json"
    images = ("nvcr.io/nvidia/pytorch:25.01-py3", "busybox", "ghcr.io/a/b@sha256:" + "0" * 64)
    apf.write_text(json.dumps(apf_document(images)))
    request = read_request(apf)
    assert request is not None and request.images == images
    # no pod network: the VM serves no pod on this boot
    assert set(json.loads(apf.read_text())) == {WARM_KEY}


def test_a_pods_apf_json_has_no_request(tmp_path: Path) -> None:
    apf = tmp_path / "apf.json"
    assert read_request(apf) is None  # no file at all
    apf.write_text(json.dumps({"pod-name": "train", "pod-network": None, "peerpods-devices": {}}))
    assert read_request(apf) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"v": 2, "images": []}, "v"),
        ({"v": 1, "images": "busybox"}, "images"),
        ({"v": 1, "images": ["two words"]}, "no spaces"),
        ({"v": 1, "images": [""]}, "not an image name"),
        ({"v": 1, "images": ["x"] * 65}, "images"),
        ({"v": 1, "images": [], "extra": 1}, "extra"),
        ([], "dictionary"),
    ],
)
def test_a_malformed_request_is_named(tmp_path: Path, value: object, says: str) -> None:
    apf = tmp_path / "apf.json"
    apf.write_text(json.dumps({WARM_KEY: value}))
    with pytest.raises(MalformedWarmRequest) as raised:
        read_request(apf)
    assert str(apf) in str(raised.value) and says in str(raised.value)


@pytest.mark.parametrize("text", ["{not json", "[1]", "NaN", '"text"'])
def test_an_unreadable_apf_json_is_not_taken_for_a_pods(tmp_path: Path, text: str) -> None:
    apf = tmp_path / "apf.json"
    apf.write_text(text)
    with pytest.raises(WarmRequestError) as raised:
        read_request(apf)
    assert not isinstance(raised.value, MalformedWarmRequest)


def test_serve_refuses_an_image_a_request_cannot_carry(capsys: pytest.CaptureFixture[str]) -> None:
    assert WarmPoolSettings(warm_pool_images="busybox, nvcr.io/x:1").warm_pool_images == (
        "busybox",
        "nvcr.io/x:1",
    )
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--provider", "local", "--warm-pool-image", "two words"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--warm-pool-image" in err and "no spaces" in err and "Traceback" not in err
