"""The suite's network guard itself works."""

import socket

import pytest

from tests import conftest


def test_non_loopback_connect_is_refused_and_recorded() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(ConnectionRefusedError, match="non-loopback"):
            sock.connect(("10.0.0.1", 15150))
    finally:
        sock.close()
    assert conftest._violations[-1] == "socket.connect to '10.0.0.1'"
    conftest._violations.pop()  # this test tripped the guard on purpose


def test_loopback_is_allowed() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(server.getsockname())
        client.close()
    finally:
        server.close()
