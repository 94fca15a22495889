"""Each webhook setting is declared once (webhook._settings): `peerpods webhook` builds its
server config and policy from the parsed sections, and what the webhook builds in code without
them (tests, `peerpods plan`) takes the same declared defaults, never a second copy."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from adaptor.cli import flags
from adaptor.cli.main import build_parser
from adaptor.cli.settings import WebhookSettings
from adaptor.cli.webhook import _server_config
from providers.core.settings import settings
from webhook import (
    Admission,
    AdmissionPolicy,
    CapacityPolicy,
    KubeResolver,
    ServerConfig,
    ServerSettings,
    Settings,
    VmChoices,
    WebhookPolicy,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(key)


def test_objects_built_in_code_take_the_declared_defaults() -> None:
    policy = WebhookPolicy()
    config = ServerConfig()
    for name, info in ServerSettings.model_fields.items():
        assert getattr(config, name) == info.get_default(call_default_factory=True), name
    limits = config.limits
    assert (limits.max_request_bytes, limits.max_connections) == (3 << 20, 256)
    assert limits.reserved_connections == config.reserved_connections
    assert not limits.require_client_cert
    built = Settings()
    assert built.runtime_classes == policy.runtime_classes == frozenset({"kata-remote"})
    assert built.impossible == policy.impossible
    assert built.allowed_machine_types == frozenset(policy.allowed_machine_types)
    assert built.capacity == CapacityPolicy.of(policy) == CapacityPolicy()
    assert Admission(built).cel_timeout_seconds == policy.cel_timeout_seconds
    assert KubeResolver().ttl_seconds == policy.cache_ttl_seconds
    assert VmChoices() == VmChoices(policy.vm_image_namespaces, policy.allowed_vm_images)


def test_the_command_declares_no_webhook_setting_again() -> None:
    own = set(WebhookSettings.model_fields) - set(ServerSettings.model_fields)
    own -= set(WebhookPolicy.model_fields)
    assert own == {"provider", "region", "catalog_dir"}
    # the command's flags are exactly the sections' (each flag once)
    names = [s.flag.name for s in settings(WebhookSettings)]
    assert len(names) == len(set(names))
    declared = {s.flag.name for s in settings(ServerSettings, WebhookPolicy, AdmissionPolicy)}
    assert declared <= set(names)


def test_flags_and_env_twins_reach_the_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEERPODS_MAX_CONNECTIONS", "7")
    monkeypatch.setenv("PEERPODS_CEL_TIMEOUT", "2s")
    monkeypatch.setenv("PEERPODS_NAMESPACE_CAPACITY_TYPES", "ml=spot")
    argv = ["webhook", "--port", "0", "--client-ca-file", "/ca.pem", "--api-server-cidrs",
            "10.0.0.0/8", "--impossible", "warn"]  # fmt: skip
    args = build_parser().parse_args(argv)
    config = _server_config(args)
    assert (config.port, config.max_connections) == (0, 7)
    assert config.client_ca_file == Path("/ca.pem") and config.limits.require_client_cert
    assert [str(n) for n in config.api_server_networks] == ["10.0.0.0/8"]
    policy = flags.section(WebhookPolicy, args)
    assert policy.cel_timeout_seconds == 2.0
    settings_ = Settings.of(policy)
    assert settings_.impossible == "warn"
    assert settings_.capacity.allowed_in("ml") == CapacityPolicy.of(policy).allowed_in("ml")
    assert [str(t) for t in settings_.capacity.allowed_in("ml")] == ["spot"]


def test_the_defaults_are_written_once_in_the_webhook_and_its_command() -> None:
    sources = [*sorted((ROOT / "webhook").glob("*.py")), ROOT / "adaptor/cli/webhook.py",
               ROOT / "adaptor/cli/settings.py"]  # fmt: skip
    written: dict[object, list[str]] = {}
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
                written.setdefault(node.value, []).append(f"{path.name}:{node.lineno}")
    for value in (8443, "kata-remote", "/etc/peerpods/tls/tls.crt", "/etc/peerpods/seal"):
        assert len(written.get(value, [])) == 1, (value, written.get(value))
