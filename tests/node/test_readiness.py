"""The adaptor's readiness (`/readyz`, the DaemonSet's readiness probe): not ready while its cloud
does not answer, with the reason, ready once it does, unready again when it stops answering;
`/healthz` stays ok throughout (the process lives)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from adaptor.node.daemon import Daemon
from adaptor.node.readiness import Readiness
from providers.core.base import Instance
from providers.core.errors import ProviderError
from tests.adaptor.daemon_proc import daemon_settings
from tests.adaptor.fakes import FakeProvider

ROOT = Path(__file__).resolve().parents[2]


class Unanswering(FakeProvider):
    """A cloud whose listing fails until told otherwise (credentials missing, then fixed)."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = ProviderError("no credentials (AuthFailure)")
        self.asked = 0

    async def list_owned(self) -> list[Instance]:
        self.asked += 1
        if self.error is not None:
            raise self.error
        return await super().list_owned()


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


async def _get(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(url, headers={"Host": "127.0.0.1"})


async def _until_status(url: str, code: int) -> httpx.Response:
    for _ in range(200):
        reply = await _get(url)
        if reply.status_code == code:
            return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered {code}: {reply.status_code} {reply.text}")


async def test_not_ready_until_the_cloud_answers(root: Path) -> None:
    provider = Unanswering()
    daemon = Daemon(daemon_settings(root, status_address="127.0.0.1:0"), provider=provider)
    await daemon.start()
    try:
        assert daemon.status is not None and daemon.readiness is not None
        daemon.readiness.retry_seconds = 0.05
        base = daemon.status.url
        unready = await _until_status(f"{base}/readyz", 503)
        assert unready.text == "fake: no credentials (AuthFailure)"
        assert (await _get(f"{base}/healthz")).status_code == 200  # alive all the same
        provider.error = None
        ready = await _until_status(f"{base}/readyz", 200)
        assert ready.text == "ok"
    finally:
        await daemon.close()
    assert daemon.readiness is None  # its task was stopped with the daemon


async def test_a_cloud_that_stops_answering_makes_the_node_unready() -> None:
    provider = Unanswering()
    provider.error = None
    serving = True
    readiness = Readiness(provider, lambda: serving, timeout_seconds=0.2)
    assert await readiness.check() == (False, "fake: the cloud has not been asked yet")
    assert await readiness.ask_cloud() is True
    assert await readiness.check() == (True, "ok")
    provider.error = RuntimeError("an SDK error nobody mapped")
    assert await readiness.ask_cloud() is False
    assert await readiness.check() == (False, "fake: RuntimeError: an SDK error nobody mapped")
    provider.error = None
    serving = False
    await readiness.ask_cloud()
    assert await readiness.check() == (False, "the hypervisor socket does not serve yet")


async def test_a_hanging_cloud_is_not_ready_within_its_timeout() -> None:
    class Hanging(FakeProvider):
        async def list_owned(self) -> list[Instance]:
            await asyncio.sleep(60)
            return []

    readiness = Readiness(Hanging(), lambda: True, timeout_seconds=0.1)
    assert await readiness.ask_cloud() is False
    assert await readiness.check() == (False, "fake: no answer within 0.1s")


def test_the_daemonset_probes_readiness_and_liveness_apart() -> None:
    (daemonset,) = yaml.safe_load_all((ROOT / "config/deploy/adaptor/daemonset.yaml").read_text())
    (adaptor,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert adaptor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert adaptor["livenessProbe"]["httpGet"]["path"] == "/healthz"
