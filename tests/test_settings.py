"""Every setting is declared once (`providers.core.settings`), and its env twin is checked exactly
like its flag: an invalid value stops the command with exit 2 and one line naming the variable,
never a silent fallback or a traceback."""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptor.cli import flags
from adaptor.cli.main import SUBCOMMANDS, build_parser, main
from adaptor.hypervisor import ManagerConfig
from adaptor.node.settings import ServeSettings
from adaptor.podnet import PodNetSettings
from adaptor.settings import AgentTls, CdiSettings
from providers.clouds import registry
from providers.core.errors import InvalidRequest
from providers.core.settings import Setting, format_duration, parse_duration, settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("adaptor", "providers", "webhook")


def leaves(
    parser: argparse.ArgumentParser, argv: list[str], inherited: tuple[Setting, ...] = ()
) -> Iterator[tuple[list[str], tuple[Setting, ...]]]:
    """Each runnable command line (placeholders for required arguments) with every setting it
    resolves: its own and those of the parsers above it."""
    own = tuple(v for k, v in parser._defaults.items() if k.startswith("_setting:"))
    found = inherited + own
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subparsers:
        for name, child in subparsers[0].choices.items():
            yield from leaves(child, [*argv, name], found)
        return
    extra: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            extra.append("placeholder")
        elif action.required:
            extra += [action.option_strings[0], "placeholder"]
    yield [*argv, *extra], found


def invalid_text(setting: Setting) -> str:
    """A value the setting's declaration refuses, as specific to its type as it has."""
    if setting.is_bool:
        return "ture"
    if setting.choices:
        return "not-one-of-them"
    if setting.flag.duration:
        return "5 minutes"
    if setting.is_int:
        return "many"
    return "bad\x01value"  # free text: control characters are refused everywhere


def cases() -> list[tuple[list[str], Setting]]:
    found: list[tuple[list[str], Setting]] = []
    top = build_parser()
    for argv, declared in leaves(top, []):
        unique = {s.flag.env: s for s in declared}
        found += [(argv, s) for s in unique.values()]
    return found


CASES = cases()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(key)


def test_every_command_and_setting_is_covered() -> None:
    commands = {argv[0] for argv, _ in CASES}
    assert commands == set(SUBCOMMANDS)
    serve = {s.flag.env for argv, s in CASES if argv[0] == "serve"}
    for section in (ServeSettings, AgentTls, CdiSettings, *registry.sections()):
        assert {s.flag.env for s in settings(section)} <= serve
    assert len(CASES) > 150


@pytest.mark.parametrize(
    ("argv", "setting"), CASES, ids=[f"{' '.join(a[:2])}:{s.flag.env}" for a, s in CASES]
)
def test_an_invalid_env_value_exits_2_naming_the_variable(
    argv: list[str],
    setting: Setting,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def must_not_run(args: argparse.Namespace) -> int:
        raise AssertionError(f"{setting.flag.env} was accepted: the command ran")

    for module_name, _ in SUBCOMMANDS.values():
        monkeypatch.setattr(f"{module_name}.run", must_not_run)
    text = invalid_text(setting)
    monkeypatch.setenv(setting.flag.env, text)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"peerpods {argv[0]}: {setting.flag.env}: invalid "), lines
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize(
    ("env", "value", "flag_argv", "dest", "expected"),
    [
        ("PEERPODS_AGENT_TLS", "false", ["--no-agent-tls"], "agent_tls", False),
        ("PEERPODS_EXT_NETWORK_VIA_PODVM", "yes", ["--ext-network-via-podvm"], None, True),
        ("PEERPODS_PROXY_TIMEOUT", "1h30m", ["--proxy-timeout", "1h30m"], None, 5400.0),
        ("PEERPODS_VXLAN_PORT", "4790", ["--vxlan-port", "4790"], None, 4790),
        ("PEERPODS_ALLOWED_IMAGES", "a, b,", ["--allowed-images", "a, b,"], None, ("a", "b")),
        ("PEERPODS_AWS_USE_PUBLIC_IP", "on", ["--aws-use-public-ip", "on"], None, True),
        ("PEERPODS_AGENT_TLS_CA", "", ["--agent-tls-ca", ""], "agent_tls_ca", None),
    ],
)
def test_env_twin_and_flag_mean_the_same(
    env: str,
    value: str,
    flag_argv: list[str],
    dest: str | None,
    expected: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dest = dest or flag_argv[0].lstrip("-").replace("-", "_")
    by_flag = build_parser().parse_args(["serve", *flag_argv])
    monkeypatch.setenv(env, value)
    by_env = build_parser().parse_args(["serve"])
    assert getattr(by_env, dest) == getattr(by_flag, dest) == expected


def test_the_command_line_wins_over_the_env_twin_and_unset_means_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PEERPODS_VXLAN_PORT", "4791")
    monkeypatch.setenv("PEERPODS_SOCKET", "/s")
    args = build_parser().parse_args(["serve", "--vxlan-port", "4790"])
    built = flags.section(ServeSettings, args)
    assert (built.vxlan_port, str(built.socket)) == (4790, "/s")
    assert built.forwarder_port == ServeSettings.model_fields["forwarder_port"].default


def test_one_commands_env_twin_never_fails_another_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # valid for serve, invalid for select and webhook: only the command that runs checks them
    monkeypatch.setenv("PEERPODS_PROVIDER", "static")
    monkeypatch.setenv("PEERPODS_IMPOSSIBLE", "allow")
    args = build_parser().parse_args(["serve"])
    assert args.provider == "static"
    built = flags.section(ServeSettings, args, agent_tls=flags.section(AgentTls, args))
    assert built.provider == "static"


def test_sub_configs_are_built_from_their_sections() -> None:
    serve = ServeSettings.build(forwarder_port=15151, vxlan_port=4790, start_timeout_seconds=5)
    manager = ManagerConfig.of(serve)
    podnet = PodNetSettings.of(serve)
    assert (manager.forwarder_port, manager.start_timeout_seconds) == (15151, 5.0)
    assert (podnet.vxlan_port, podnet.vxlan_min_id) == (4790, serve.vxlan_min_id)
    # a section's defaults are the serve defaults, not a second declaration
    assert ManagerConfig().forwarder_port == ServeSettings().forwarder_port
    assert PodNetSettings().vxlan_min_id == ServeSettings().vxlan_min_id


def test_durations_read_back_as_the_help_shows_them() -> None:
    for seconds in (0.0, 0.25, 10.0, 30.0, 60.0, 300.0, 900.0, 5400.0, 7200.0):
        assert parse_duration(format_duration(seconds)) == seconds


def numeric_literals() -> dict[float, list[str]]:
    """Every int and float constant in the package sources, with where it stands."""
    found: dict[float, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "gen" in path.relative_to(ROOT).parts:
                continue  # generated protobuf code
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.setdefault(float(node.value), []).append(where)
    return found


def test_each_serve_default_is_written_once() -> None:
    literals = numeric_literals()
    sections = (ServeSettings, AgentTls, CdiSettings, *registry.sections())
    # The figures once written three times each are written once in all three packages.
    start_timeout = ServeSettings.model_fields["start_timeout_seconds"].default
    for value in sorted({15150.0, 555000.0, 4789.0, float(start_timeout)}):
        assert len(literals.get(value, [])) == 1, (value, literals.get(value))
    # Every other large serve default is written once in the code that serve runs (the webhook
    # and the model may hold the same number for another purpose, e.g. 4096 as a cache size).
    distinctive = {
        float(s.default)
        for s in settings(*sections)
        if type(s.default) in (int, float) and s.default >= 1000
    }
    serve_code = ("adaptor/", "providers/clouds/")
    for value in sorted(distinctive):
        found = [where for where in literals.get(value, []) if where.startswith(serve_code)]
        assert len(found) == 1, (value, found)


def test_the_deployment_manifests_set_only_valid_values() -> None:
    from tests.test_deploy import DOCUMENTS

    by_command = {
        command: {s.flag.env: s for argv, s in CASES if argv[0] == command}
        for command in ("serve", "webhook")
    }
    checked = 0
    for path, doc in DOCUMENTS:
        command = "webhook" if "webhook" in path.parts else "serve"
        values: dict[str, str] = {}
        if doc["kind"] == "ConfigMap":
            values |= {k: str(v) for k, v in doc.get("data", {}).items()}
        if doc["kind"] in ("DaemonSet", "Deployment"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                values |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        for name, value in values.items():
            setting = by_command[command].get(name) or by_command["webhook"].get(name)
            if setting is not None:
                setting.parse(value)  # raises on a value the command would refuse
                checked += 1
    assert checked > 5


def test_a_flag_declared_in_place_gets_the_same_env_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = argparse.ArgumentParser(prog="peerpods x")
    flags.add(parser, "--count", type=int, default=3, help="how many")
    flags.add(parser, "--wait", type=flags.duration, default="1m", help="how long")
    flags.add(parser, "--mode", default="a", choices=["a", "b"], help="which")
    flags.add(parser, "--dry-run", action="store_true", help="only say")
    args = parser.parse_args([])
    flags.resolve(args, {})
    assert (args.count, args.wait, args.mode, args.dry_run) == (3, 60.0, "a", False)
    args = parser.parse_args(["--count", "4"])
    flags.resolve(args, {"PEERPODS_COUNT": "x", "PEERPODS_WAIT": "2h", "PEERPODS_DRY_RUN": "on"})
    assert (args.count, args.wait, args.dry_run) == (4, 7200.0, True)
    for env, text in (
        ("PEERPODS_COUNT", "x"),
        ("PEERPODS_MODE", "c"),
        ("PEERPODS_DRY_RUN", "ture"),
    ):
        with pytest.raises(InvalidRequest, match=f"^{env}: invalid "):
            flags.resolve(parser.parse_args([]), {env: text})
    assert "[env PEERPODS_COUNT]" in parser.format_help()


def test_one_flag_declared_twice_differently_is_refused() -> None:
    from typing import Annotated

    from pydantic import Field

    from providers.core.settings import Flag, Section

    class One(Section):
        port: Annotated[int, Flag("--port")] = Field(1, description="a port")

    class Other(Section):
        port: Annotated[int, Flag("--port")] = Field(2, description="a port")

    class Again(One):
        pass

    parser = argparse.ArgumentParser()
    flags.add_settings(parser, One, Again)  # the same declaration twice: one flag
    assert [s.section for s in flags.declared(parser)] == [One]
    with pytest.raises(ValueError, match="--port is declared twice"):
        flags.add_settings(parser, Other)
