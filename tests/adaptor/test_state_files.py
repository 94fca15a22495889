"""The state database is the adaptor's alone: its files are 0600 however the umask is set and
however an older build left them, and a JSON column the layers above reject is quarantined."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptor.node.wiring import stored_json_checks
from adaptor.state import QuarantinedRecord, SandboxRecord, StateStore
from adaptor.state.store import StateError


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}


def widen(directory: Path) -> None:
    for path in directory.iterdir():
        path.chmod(0o644)


async def test_database_files_are_created_0600(tmp_path: Path, open_umask: None) -> None:
    store = await StateStore.open(tmp_path / "state")
    try:
        await store.put(SandboxRecord(id="sb1", pod_namespace="ns", pod_name="p"))
        found = modes(tmp_path / "state")
        assert {"sandboxes.db", "sandboxes.db-wal", "sandboxes.db-shm"} <= set(found)
        assert set(found.values()) == {0o600}, found
        assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    finally:
        await store.close()


async def test_wider_files_of_an_older_build_are_narrowed(tmp_path: Path, open_umask: None) -> None:
    store = await StateStore.open(tmp_path)
    await store.put(SandboxRecord(id="sb1", pod_namespace="ns", pod_name="p"))
    await store.close()
    widen(tmp_path)
    store = await StateStore.open(tmp_path)
    try:
        assert await store.get("sb1") is not None
        assert set(modes(tmp_path).values()) == {0o600}, modes(tmp_path)
    finally:
        await store.close()


async def test_a_wrongly_typed_tunnel_field_is_quarantined(tmp_path: Path) -> None:
    tunnel = {
        "v": 1,
        "netns": "/run/netns/cni-x",
        "remote": "",
        "state": "inspected",
        "error": "",
        "network": {"podip": "10.0.0.2/24", "pod-hw-addr": "", "interface": "eth0",
                    "worker-node-ip": "192.168.0.2/16", "mtu": "x", "vxlan-id": 555000},
    }  # fmt: skip
    store = await StateStore.open(tmp_path, checks=stored_json_checks())
    try:
        await store.put(SandboxRecord(id="good", pod_namespace="ns", pod_name="p"))
        await store.put(
            SandboxRecord(
                id="bad", pod_namespace="ns", pod_name="q", pod_network=json.dumps(tunnel)
            )
        )
        assert [r.id for r in await store.records()] == ["good"]
        reason = (await store.quarantined())["bad"]
        assert "invalid literal for int()" in reason
        with pytest.raises(QuarantinedRecord, match="bad"):
            await store.get("bad")
    finally:
        await store.close()


async def test_checks_name_only_the_json_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no checked column annotations"):
        await StateStore.open(tmp_path, checks={"annotations": json.loads})


async def test_a_checked_value_is_parsed_once_and_a_changed_one_again(tmp_path: Path) -> None:
    """Reading a sandbox again (each step, each listing) does not check a JSON column whose
    value was found valid already; a new value is checked, and a bad one quarantines the row."""
    checked: list[str] = []

    def check(value: str) -> object:
        checked.append(value)
        parsed = json.loads(value)
        if not isinstance(parsed.get("n"), int):
            raise TypeError("n is not a number")
        return parsed

    store = await StateStore.open(tmp_path, checks={"pod_network": check})
    try:
        record = SandboxRecord(id="sb", pod_namespace="ns", pod_name="p", pod_network='{"n": 1}')
        await store.put(record)
        await store.get("sb")
        await store.put(record.evolve(reason="later step"))
        await store.get("sb")
        await store.records()
        assert checked == ['{"n": 1}']
        await store.put(record.evolve(pod_network='{"n": 2}'))
        await store.get("sb")
        assert checked == ['{"n": 1}', '{"n": 2}']
        await store.put(record.evolve(pod_network='{"n": "x"}'))
        with pytest.raises(QuarantinedRecord, match="n is not a number"):
            await store.get("sb")
        await store.put(record)  # the first value again: checked anew after the quarantine
        assert await store.get("sb") is not None
        assert checked[-1] == '{"n": 1}' and len(checked) == 4
    finally:
        await store.close()


async def test_an_existing_wider_state_directory_is_narrowed_to_0700(
    tmp_path: Path, open_umask: None
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # as a hostPath volume of type DirectoryOrCreate leaves it
    store = await StateStore.open(state)
    try:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
    finally:
        await store.close()


async def test_a_symlinked_or_foreign_state_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StateError, match="state directory"):
        await StateStore.open(tmp_path / "link")
    assert stat.S_IMODE(real.stat().st_mode) == 0o755  # nothing changed through the link
    assert not (real / "sandboxes.db").exists()
    if os.geteuid() == 0:
        os.chown(real, 65534, 65534)
        with pytest.raises(StateError, match="belongs to uid 65534"):
            await StateStore.open(real)
