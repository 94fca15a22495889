"""The versions the project is tested with (config/constraints.txt) are the ones every install
uses: the README's install command, tests/run (which .ci/run calls) and pip's own check that each
pin meets pyproject.toml's bounds. An unbounded `pip install` on a fresh machine took moto 5.2.5
(other AWS regions than the snapshots were made from) and pydantic 2.14 (strict mypy fails)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.test_readme import readme_commands

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = "config/constraints.txt"


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / CONSTRAINTS).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, version = line.split("==")  # every line a pin, nothing else
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name) and re.fullmatch(r"[\w.+!-]+", version)
        found[canonicalize_name(name)] = version
    return found


def test_every_install_command_uses_the_constraints() -> None:
    install, tests = readme_commands()
    assert f"pip install -c {CONSTRAINTS} -e ." in install
    assert tests == "./tests/run"
    run = (ROOT / "tests" / "run").read_text()
    installs = [line for line in run.splitlines() if "pip install" in line]
    assert installs and all(f"-c {CONSTRAINTS}" in line for line in installs)
    assert "./tests/run" in (ROOT / ".ci" / "run").read_text()


def test_the_pins_meet_pyprojects_bounds_and_cover_what_changes_behaviour() -> None:
    pinned = pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += [r for r in extra if not r.startswith("peerpods[")]
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not pinned in {CONSTRAINTS}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{requirement.name}=={pinned[name]} is outside pyproject's {requirement.specifier}"
        )
    for bounded in ("moto", "pydantic"):  # a newer release changes what the tests see
        spec = next(Requirement(r).specifier for r in requirements if r.startswith(bounded))
        assert any(s.operator == "<" for s in spec), f"{bounded} needs an upper bound"


def test_the_installed_versions_are_the_pinned_ones() -> None:
    wrong = {}
    for name, version in pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an extra this environment did not install
        if installed != version:
            wrong[name] = (installed, version)
    assert not wrong, f"installed (left) differs from {CONSTRAINTS} (right): {wrong}"
