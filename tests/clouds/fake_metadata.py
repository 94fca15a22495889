"""Fake instance metadata services on loopback, each as strict as the real one about its
protocol: AWS IMDSv2 (a PUT for a session token, then reads that carry it; 401 without),
Azure IMDS (`Metadata: true`, else 400) and GCP's metadata server (`Metadata-Flavor: Google`,
else 403). Every request is recorded (header names in lower case)."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAC = "0e:11:22:33:44:55"


class FakeMetadata:
    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self.token = secrets.token_hex(8)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.aws = {
            "placement/region": "eu-west-1",
            "mac": MAC,
            f"network/interfaces/macs/{MAC}/subnet-id": "subnet-0a1b2c3d",
            f"network/interfaces/macs/{MAC}/security-group-ids": "sg-0node\nsg-0peerpods",
            f"network/interfaces/macs/{MAC}/vpc-id": "vpc-0123",
        }
        self.azure = {"subscriptionId": "sub-1", "resourceGroupName": "rg-nodes",
                      "location": "westeurope", "vmSize": "Standard_D4s_v5"}  # fmt: skip
        self.gcp = {
            "project/project-id": "my-project",
            "instance/zone": "projects/123456/zones/europe-west4-a",
            "instance/network-interfaces/0/network": "projects/123456/networks/gpu-vpc",
        }
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def put(self, path: str, headers: Message[str, str]) -> tuple[int, str]:
        """AWS hands out a session token to a PUT that asks for a lifetime."""
        if self.cloud == "aws" and path == "/latest/api/token":
            if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, ""
            return 200, self.token
        return 404, ""

    def get(self, path: str, headers: Message[str, str]) -> tuple[int, str]:
        """A read, refused as the real service refuses one without its header."""
        if self.cloud == "aws":
            if headers.get("X-aws-ec2-metadata-token") != self.token:
                return 401, ""
            key = path.removeprefix("/latest/meta-data/")
            if key in self.aws:
                return 200, self.aws[key]
        elif self.cloud == "azure":
            if headers.get("Metadata") != "true":
                return 400, '{"error": "Bad request"}'
            if path == "/metadata/instance/compute?api-version=2021-02-01":
                return 200, json.dumps(self.azure)
        elif self.cloud == "gcp":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, ""
            key = path.removeprefix("/computeMetadata/v1/")
            if key in self.gcp:
                return 200, self.gcp[key]
        return 404, ""


def _handler(fake: FakeMetadata) -> type[BaseHTTPRequestHandler]:
    """The request handler of `fake`'s server: records each request, answers as `fake` says."""

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            fake.requests.append(
                (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            )

        def do_PUT(self) -> None:
            self._record()
            self._send(*fake.put(self.path, self.headers))

        def do_GET(self) -> None:
            self._record()
            self._send(*fake.get(self.path, self.headers))

        def _send(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_metadata(cloud: str) -> Iterator[FakeMetadata]:
    fake = FakeMetadata(cloud)
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.httpd.shutdown()
        fake.httpd.server_close()
        fake.thread.join()
