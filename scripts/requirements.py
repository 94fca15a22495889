"""Print the requirement lines of peerpods with the given extras, read from pyproject.toml.

The image build installs these in a layer of their own, before the source is copied in, so a
change to the code does not download every dependency again:

    python3 scripts/requirements.py pyproject.toml all > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies plus those of each extra (an extra naming the project itself,
    like `all = ["peerpods[aws,azure,gcp]"]`, is followed)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    name = project["name"]
    own = re.compile(rf"^{re.escape(name)}\[([^\]]*)\]$")
    found = list(project.get("dependencies", []))
    pending, seen = [e.strip() for e in extras if e.strip()], set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"requirements: {name} has no extra {extra!r}")
        seen.add(extra)
        for requirement in optional[extra]:
            match = own.match(requirement.replace(" ", ""))
            if match:
                pending.extend(match.group(1).split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: requirements.py PYPROJECT [EXTRA[,EXTRA...]]", file=sys.stderr)
        return 2
    extras = argv[1].split(",") if len(argv) > 1 else []
    print("\n".join(requirements(Path(argv[0]), extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
