"""The instance metadata client against metadata services that misbehave, on loopback: one that
drips its answer is cut off at the timeout (the whole request, not each read); a redirect is
never followed, so the IMDSv2 token never reaches another address; garbage (not HTTP, cut
short, not text, nested, names that are not names) is "did not answer", never a crash. And
`serve` itself, as a process, refuses each with one line and no traceback, and ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.clouds.metadata import MetadataUnavailable, aws_node, azure_node, gcp_node
from tests.hostile_http import Answer, Conn, Head, HostileServer, drip, finished, hostile, reply

TOKEN = "AQAEAFakeToken0123456789=="
OK = b"HTTP/1.1 200 OK\r\n"


@pytest.fixture(autouse=True)
def _metadata_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)


def imds(reads: Answer) -> Answer:
    """IMDSv2's token to a PUT; every GET answered by `reads`."""

    def answer(conn: Conn, head: Head) -> None:
        if head.method == "PUT":
            reply("200 OK", TOKEN.encode())(conn, head)
        else:
            reads(conn, head)

    return answer


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(drip(OK + b"Content-Length: 100\r\n\r\n"), id="token-body"),
        pytest.param(drip(OK + b"X-Drip: "), id="token-headers"),
        pytest.param(imds(drip(OK + b"Content-Length: 100\r\n\r\n")), id="read-body"),
    ],
)
def test_a_dripping_service_is_cut_off_at_the_timeout(answer: Answer) -> None:
    with hostile(answer) as server:
        failed = finished(lambda: aws_node(server.url, timeout=1))
    assert isinstance(failed, MetadataUnavailable), failed
    assert "no answer within 1s" in str(failed)


@pytest.fixture
def elsewhere() -> Iterator[HostileServer]:
    """Another address on loopback, which must never be asked."""
    with hostile(reply("200 OK", b"0e:11:22:33:44:55")) as server:
        yield server


@pytest.mark.parametrize("status", ["301 Moved Permanently", "302 Found", "307 Temporary Redirect"])
def test_a_redirect_is_never_followed_with_the_token(elsewhere: HostileServer, status: str) -> None:
    location = {"Location": f"{elsewhere.url}/latest/meta-data/mac"}
    with hostile(imds(reply(status, b"", location))) as server:
        with pytest.raises(MetadataUnavailable, match="a redirect \\(never followed\\)"):
            aws_node(server.url, timeout=2)
        assert [h.method for h in server.heads] == ["PUT", "GET"]
        assert server.heads[1].headers["x-aws-ec2-metadata-token"] == TOKEN
    assert elsewhere.heads == []  # neither the token nor anything else went there


def test_a_redirected_token_request_is_not_followed(elsewhere: HostileServer) -> None:
    location = {"Location": f"{elsewhere.url}/latest/api/token"}
    with (
        hostile(reply("307 Temporary Redirect", b"", location)) as server,
        pytest.raises(MetadataUnavailable, match="never followed"),
    ):
        aws_node(server.url, timeout=2)
    assert elsewhere.heads == []


def _raw(data: bytes) -> Answer:
    def answer(conn: Conn, head: Head) -> None:
        conn.send(data)

    return answer


GARBAGE = {
    "not-http": _raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "cut-short": _raw(OK + b"Content-Length: 100\r\n\r\nAQAE"),
    "header-too-long": _raw(OK + b"X: " + b"a" * 70000 + b"\r\n\r\n"),
    "bad-length": _raw(OK + b"Content-Length: lots\r\n\r\nAQAE"),
    "not-text": reply("200 OK", b"\xff\xfe\x00token"),
    "token-with-newline": reply("200 OK", b"tok\nX-Injected: 1"),
    "mac-a-path": imds(reply("200 OK", b"../../../../user-data")),
    "region-not-one": imds(reply("200 OK", b"0e:11:22:33:44:55")),
}


@pytest.mark.parametrize("answer", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_from_imds_is_unavailable_not_a_crash(answer: Answer) -> None:
    with hostile(answer) as server:
        failed = finished(lambda: aws_node(server.url, timeout=2))
    assert isinstance(failed, MetadataUnavailable), repr(failed)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"subscriptionId": "s", "resourceGroupName": "rg", "location": "west europe"}',
        b'{"subscriptionId": "s/../x", "resourceGroupName": "rg", "location": "eastus"}',
        b"[1, 2]",
    ],
    ids=["nested", "location-with-space", "subscription-a-path", "a-list"],
)
def test_garbage_from_azure_imds_is_unavailable(body: bytes) -> None:
    with hostile(reply("200 OK", body)) as server:
        failed = finished(lambda: azure_node(server.url, timeout=2))
    assert isinstance(failed, MetadataUnavailable), repr(failed)


def test_garbage_from_gcp_metadata_is_unavailable() -> None:
    with hostile(reply("200 OK", b"my project; rm -rf /")) as server:
        failed = finished(lambda: gcp_node(server.url, timeout=2))
    assert isinstance(failed, MetadataUnavailable) and "project" in str(failed), repr(failed)


SERVE_CASES = {
    "drip": drip(OK + b"X-Drip: "),
    "redirect": imds(reply("302 Found", b"", {"Location": "http://127.0.0.1:9/latest"})),
    "not-http": _raw(b"\x00\x01garbage\r\n\r\n"),
    "cut-short": _raw(OK + b"Content-Length: 100\r\n\r\nAQAE"),
    "nested-token": reply("200 OK", b"[" * 100_000),
}


@pytest.mark.parametrize("answer", SERVE_CASES.values(), ids=SERVE_CASES.keys())
def test_serve_refuses_a_hostile_metadata_service_in_one_line(
    tmp_path: Path, answer: Answer
) -> None:
    pytest.importorskip("boto3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEERPODS_", "AWS_"))}
    with hostile(answer) as server:
        # a drip without a total deadline would hold serve forever: `timeout` fails the test
        result = subprocess.run(
            [
                sys.executable, "-m", "adaptor.cli.main", "serve", "--provider", "aws",
                "--pod-vm-image", "ami-1", "--aws-region", "eu-west-1",
                "--instance-metadata-url", server.url,
                "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "hv.sock"),
                "--pods-dir", str(tmp_path / "pods"), "--no-agent-tls", "--status-address", "",
            ],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("peerpods serve: aws provider: no --aws-subnet-id"), lines
    assert "IMDSv2" in lines[0] and "did not answer" in lines[0]
    assert not (tmp_path / "state").exists() and not (tmp_path / "hv.sock").exists()
