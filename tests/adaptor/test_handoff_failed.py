"""A rollout whose new `serve` cannot start (its agent TLS files do not load) must cost the
running one nothing: the successor fails before its predecessor lets go of anything, and the
predecessor goes on serving its pods, new CreateVMs and the shims' StopVMs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.adaptor.handoff_rig import running_node, sandbox_id


async def test_a_successor_with_bad_tls_files_leaves_the_predecessor_serving(root: Path) -> None:
    bad = root / "bad.pem"
    bad.write_text("not a certificate\n")
    async with running_node(root, 2) as node:
        old = node.serve
        assert old is not None and old.process is not None
        new = ServeProcess(
            root,
            [
                *[a for a in old.args if a != "--no-agent-tls"],
                "--agent-tls-ca",
                str(bad),
                "--agent-tls-cert",
                str(bad),
                "--agent-tls-key",
                str(bad),
            ],
            logs=list(old.logs),
        )
        with pytest.raises(RuntimeError, match="did not start"):
            await new.start(timeout_seconds=60)
        assert "no certificate or crl found" in new.log()
        await asyncio.sleep(0.5)
        assert old.process.returncode is None  # the predecessor never let go
        for shim in node.shims:
            assert shim.open and shim.pause_wait is not None and not shim.pause_wait.done()
        created = await node.hypervisor(
            "CreateVM", pb.CreateVMRequest(id="late", annotations=ANNOTATIONS)
        )
        assert pb.CreateVMResponse.FromString(created).agentSocketPath
        await node.hypervisor("StopVM", pb.StopVMRequest(id="late"))
        for index in range(2):  # each shim's one StopVM is answered, nothing was abandoned
            await node.hypervisor("StopVM", pb.StopVMRequest(id=sandbox_id(index)))
        assert old.rows("SELECT id FROM sandboxes") == []
        assert "abandoned" not in old.log()
