"""The contract-seal key comes from its own Secret, with a rotation that never strips a pod's
GPUs: while a key is accepted, a pod sealed under it is still recognised (its reinvocation keeps
`default_gpus` and the device plan) and an update re-seals it under the current key; the TLS key
plays no part; a missing or short key stops the webhook at start with one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptor.cli.main import main
from providers.core import contract
from webhook import Admission, SealKeyError, Settings, load_seal_keys, mutate_pod
from webhook._admission import _reseal
from webhook._sealkeys import derive

ROOT = Path(__file__).resolve().parents[2]
K1, K2 = b"first-key-" + b"a" * 30, b"second-key-" + b"b" * 30


def secret_dir(directory: Path, **keys: bytes) -> Path:
    """A Secret as the kubelet mounts it: a timestamped directory behind `..data`, each key a
    link into it."""
    stamp = directory / "..2026_11_27_04_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, value in keys.items():
        (stamp / name).write_bytes(value + b"\n")
    (directory / "..data").symlink_to(stamp.name)
    for name in keys:
        (directory / name).symlink_to(f"..data/{name}")
    return directory


def gpu_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team"},
        "spec": {"runtimeClassName": "kata-remote", "containers": [
            {"name": "main", "image": "x",
             "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}}}]},
    }  # fmt: skip


def settings_of(directory: Path) -> Settings:
    keys = load_seal_keys(directory)
    return Settings(seal_key=keys.current, accepted_seal_keys=keys.accepted)


def test_a_mounted_secret_gives_the_current_key_and_the_accepted_ones(tmp_path: Path) -> None:
    keys = load_seal_keys(secret_dir(tmp_path / "s", current=K2, previous=K1))
    assert keys.current == derive(K2) and keys.accepted == (derive(K1),)
    assert derive(K1) != derive(K2) and len(keys.current) == 32
    alone = load_seal_keys(secret_dir(tmp_path / "one", current=K1))
    assert alone.accepted == ()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({}, "no contract-seal key at .*/current: create the Secret peerpods-webhook-seal"),
        ({"current": b"short"}, "holds 5 bytes, fewer than 32"),
        ({"current": K1, "previous": b"x" * 8}, "previous holds 8 bytes"),
    ],
)
def test_bad_keys_are_refused(tmp_path: Path, keys: dict[str, bytes], message: str) -> None:
    directory = secret_dir(tmp_path / "s", **keys)
    with pytest.raises(SealKeyError, match=message):
        load_seal_keys(directory)


def test_a_rotation_never_strips_a_sealed_pods_gpus(tmp_path: Path) -> None:
    before = settings_of(secret_dir(tmp_path / "0", current=K1))
    admitted = mutate_pod(gpu_pod(), settings=before, namespace="team").pod
    annotations = admitted["metadata"]["annotations"]
    assert annotations[contract.DEFAULT_GPUS] == "2" and contract.DEVICES in annotations

    # what the TLS-derived key did: a new key alone no longer knows the pod, and its
    # reinvocation loses the GPUs (the pod has no nvidia.com/gpu left to translate)
    stranger = mutate_pod(admitted, settings=settings_of(
        secret_dir(tmp_path / "x", current=K2)), namespace="team")  # fmt: skip
    assert contract.DEFAULT_GPUS not in stranger.pod["metadata"]["annotations"]

    # step 1 (K2 accepted) and step 2 (K2 current, K1 previous): recognised, nothing removed
    for step in (
        secret_dir(tmp_path / "1", current=K1, next=K2),
        secret_dir(tmp_path / "2", current=K2, previous=K1),
    ):
        again = mutate_pod(admitted, settings=settings_of(step), namespace="team")
        kept = again.pod["metadata"]["annotations"]
        assert kept[contract.DEFAULT_GPUS] == "2"
        assert kept[contract.DEVICES] == annotations[contract.DEVICES]
    # a pod sealed in step 2 by a replica already on K2 is known to a replica still on step 1
    sealed_by_new = mutate_pod(gpu_pod(), settings=settings_of(tmp_path / "2"), namespace="team")
    on_old = mutate_pod(sealed_by_new.pod, settings=settings_of(tmp_path / "1"), namespace="team")
    assert on_old.pod["metadata"]["annotations"][contract.DEFAULT_GPUS] == "2"


def test_an_update_reseals_under_the_current_key(tmp_path: Path) -> None:
    old = mutate_pod(gpu_pod(), settings=settings_of(secret_dir(tmp_path / "0", current=K1)),
                     namespace="team").pod  # fmt: skip
    rotated = settings_of(secret_dir(tmp_path / "2", current=K2, previous=K1))
    resealed = _reseal(rotated, "team", old)
    annotations = resealed["metadata"]["annotations"]
    assert annotations[contract.SEAL] != old["metadata"]["annotations"][contract.SEAL]
    assert contract.sealed(derive(K2), "team", annotations)
    # and through an UPDATE review: the patch carries the new seal, the contract unchanged
    import base64
    import json

    import jsonpatch

    labelled = {**old, "metadata": {**old["metadata"], "labels": {"a": "b"}}}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team",
        "operation": "UPDATE", "userInfo": {"username": "t"}, "object": labelled,
        "oldObject": old}}  # fmt: skip
    answer = Admission(rotated).review(json.dumps(body).encode())["response"]
    assert answer["allowed"]
    stored = jsonpatch.apply_patch(labelled, json.loads(base64.b64decode(answer["patch"])))
    assert stored["metadata"]["annotations"] == annotations


def test_the_webhook_refuses_to_start_without_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["webhook", "--seal-key-dir", str(tmp_path / "none"), "--port", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("peerpods webhook: no contract-seal key at") and err.count("\n") == 1


def test_the_deployment_mounts_the_seal_secret_which_the_kustomization_never_writes() -> None:
    webhook = ROOT / "config" / "deploy" / "webhook"
    deployment = next(d for d in yaml.safe_load_all((webhook / "deployment.yaml").read_text())
                      if d and d["kind"] == "Deployment")  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/etc/peerpods/seal"]]["secret"]["secretName"] == "peerpods-webhook-seal"
    tls = volumes[mounts["/etc/peerpods/tls"]]["secret"]["secretName"]
    assert tls != "peerpods-webhook-seal"
    # re-applying the kustomization must not replace a key made by hand
    for path in (ROOT / "config" / "deploy").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Secret":
                assert doc["metadata"]["name"] != "peerpods-webhook-seal", path
