"""The public surfaces of adaptor.ttrpc and adaptor.proxy: sorted and complete."""

from __future__ import annotations

import adaptor.proxy
import adaptor.ttrpc


def test_exported_members() -> None:
    for module, expected in [
        (adaptor.ttrpc, ["CallContext", "Client", "Code", "Handler", "Server", "TtrpcError"]),
        (
            adaptor.proxy,
            [
                "AgentProxy",
                "Completion",
                "CreateContainerHook",
                "Dial",
                "client_tls_context",
                "tcp_dialer",
            ],
        ),
    ]:
        assert module.__all__ == sorted(module.__all__) == expected
        for name in module.__all__:
            assert getattr(module, name) is not None
