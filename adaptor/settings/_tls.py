"""Mutual TLS towards the pod VM forwarder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator

from providers.core.settings import Flag, Section


class AgentTls(Section):
    """Mutual TLS towards the pod VM forwarder (its CA, our client certificate and key).

    Without files, the adaptor's own CA under --state-dir signs both ends: each pod VM gets its
    server certificate in its user data, and the adaptor dials with its client certificate.
    """

    enabled: Annotated[bool, Flag("--agent-tls")] = Field(
        True,
        description="mutual TLS to the pod VM forwarder; without the three --agent-tls-* files "
        "the adaptor's own CA under --state-dir is used (it also issues each pod VM's server "
        "certificate, sent in the VM's user data)",
    )
    ca_file: Annotated[Path | None, Flag("--agent-tls-ca")] = Field(
        None, description="CA file that signed the forwarders' server certificates"
    )
    cert_file: Annotated[Path | None, Flag("--agent-tls-cert")] = Field(
        None, description="this adaptor's client certificate file"
    )
    key_file: Annotated[Path | None, Flag("--agent-tls-key")] = Field(
        None, description="this adaptor's client key file"
    )

    @model_validator(mode="after")
    def _files_when_enabled(self) -> Self:
        files = (
            ("--agent-tls-ca", self.ca_file),
            ("--agent-tls-cert", self.cert_file),
            ("--agent-tls-key", self.key_file),
        )
        given = [flag for flag, value in files if value is not None]
        if self.enabled and given and len(given) != len(files):
            missing = [flag for flag, value in files if value is None]
            raise ValueError(
                f"{', '.join(missing)} not set: give all three TLS files, or none to use the "
                "adaptor's own CA under --state-dir (or --no-agent-tls)"
            )
        if self.enabled:
            for path in (self.ca_file, self.cert_file, self.key_file):
                if path is not None and not path.is_file():
                    raise ValueError(f"agent TLS file {path} does not exist")
        return self
