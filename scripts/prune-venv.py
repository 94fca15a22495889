"""Remove from an installed virtual environment what peerpods never uses (the image build).

The dependencies bring more than peerpods uses: the Azure SDKs' asyncio clients, botocore's
models of some 400 AWS services when peerpods calls EC2, Service Quotas and the credential
services, google-cloud-compute's clients of some 130 Compute Engine APIs when peerpods calls
four, test folders, and debug information in compiled extensions (uvloop's alone is 12 MB); and
the dependencies' sources are replaced by their bytecode (one copy of the code, not two).
Each removal is named below with the reason it is safe; a path that is not there is skipped (an
extra not installed). Run it with the environment's own python: what it changed is imported
afterwards, and a failed import fails the build rather than the image.

    /opt/peerpods/bin/python scripts/prune-venv.py /opt/peerpods/lib/python3.*/site-packages
"""

from __future__ import annotations

import ast
import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Packages imported by nothing peerpods runs.
UNUSED = (
    "azure/mgmt/compute/aio",  # the asyncio clients; providers.clouds.azure uses the others
    "azure/mgmt/network/aio",
    "azure/identity/aio",
    "grpc_tools",  # protoc: a build tool, never a runtime import
    "google/cloud/compute",  # google-cloud-compute's alias of compute_v1, which peerpods imports
)
# The botocore service models providers.clouds.aws reaches: EC2, Service Quotas (account quotas),
# the Price List API, and STS and SSO for the credential chain (web identity, SSO profiles).
BOTOCORE_SERVICES = frozenset({"ec2", "service-quotas", "pricing", "sts", "sso", "sso-oidc"})
# The Compute Engine clients providers.clouds (gcp, quotas, loaders.gcp) creates; the services
# these import (their operation pollers) are kept with them.
COMPUTE_V1 = "google/cloud/compute_v1"
COMPUTE_SERVICES = frozenset({"instances", "regions", "machine_types", "accelerator_types"})
SERVICE_IMPORT = re.compile(r"compute_v1\.services(?:\.| import )(\w+)")
# The one operation group of azure-mgmt-network that providers.clouds.azure calls (a pod VM's NIC
# is read and deleted); the other 160-odd groups' classes and request builders are some 6 MiB.
NETWORK = "azure/mgmt/network"
NETWORK_OPERATIONS = frozenset({"NetworkInterfacesOperations"})
# A compiled extension with debug information carries this section name.
DEBUG_SECTION = b".debug_info"
# Left as sources: pip and setuptools (pip installs peerpods after this, then leaves the image).
KEEP_SOURCES = frozenset({"pip", "setuptools", "pkg_resources", "_distutils_hack"})


def prune(site: Path) -> tuple[int, list[str]]:
    """Remove what peerpods never uses under `site`: the bytes removed, and the modules to import
    again to show that what is left still loads."""
    before = _size(site)
    targets = [site / name for name in UNUSED]
    data = site / "botocore" / "data"
    if data.is_dir():
        targets += [p for p in data.iterdir() if p.is_dir() and p.name not in BOTOCORE_SERVICES]
    targets += list(site.glob("*/tests")) + list(site.glob("*/*/tests"))
    for path in targets:
        if path.is_dir():
            shutil.rmtree(path)
    check: list[str] = []
    if (site / NETWORK / "operations" / "_operations.py").is_file():
        prune_network_operations(site / NETWORK, NETWORK_OPERATIONS)
        check.append("azure.mgmt.network")
    if (site / COMPUTE_V1 / "services").is_dir():
        prune_compute_services(site / COMPUTE_V1, COMPUTE_SERVICES)
        check.append("google.cloud.compute_v1")
    check += strip_debug_information(site)
    to_bytecode(site)
    return before - _size(site), check


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


def prune_compute_services(package: Path, keep: frozenset[str]) -> set[str]:
    """Remove the clients of the Compute Engine APIs not in `keep` (nor imported by those kept)
    and their names from the package's __init__; the services kept."""
    services = package / "services"
    kept, pending = set(), [name for name in keep if (services / name).is_dir()]
    while pending:
        name = pending.pop()
        if name in kept:
            continue
        kept.add(name)
        for source in (services / name).rglob("*.py"):
            pending.extend(SERVICE_IMPORT.findall(source.read_text()))
    gone = {p.name for p in services.iterdir() if p.is_dir() and p.name not in kept}
    gone.discard("__pycache__")
    for name in gone:
        shutil.rmtree(services / name)
    init = package / "__init__.py"
    init.write_text(_without_services(init.read_text(), gone))
    return kept


def _without_services(source: str, gone: set[str]) -> str:
    """The package __init__ without the imports of the removed services, their client names in
    __all__, and their entries in the lazy-import set."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    names: set[str] = set()
    for node in ast.parse(source).body:
        module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 1
            and module.startswith("services.")
            and module.split(".")[1] in gone
        ):
            drop.update(range(node.lineno - 1, node.end_lineno or node.lineno))
            names.update(alias.asname or alias.name for alias in node.names)
    quoted = {f'"{name}",' for name in names}
    quoted |= {f'"google.cloud.compute_v1.services.{name}",' for name in gone}
    kept = [line for i, line in enumerate(lines) if i not in drop and line.strip() not in quoted]
    result = "".join(kept)
    compile(result, "compute_v1/__init__.py", "exec")  # still Python, or stop here
    return result


def prune_network_operations(package: Path, keep: frozenset[str]) -> set[str]:
    """Remove from azure-mgmt-network the operation groups not in `keep` (the client's mixins
    stay): their classes and the request builders only they call, their imports and the client's
    attributes for them. The operation classes removed."""
    client = package / "_client.py"
    operations = package / "operations" / "_operations.py"
    tree = ast.parse(operations.read_text())
    bases = _base_names(client.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    gone = {name for name in classes if name.endswith("Operations") and name not in keep | bases}
    used = {
        node.id
        for name, cls in classes.items()
        if name not in gone
        for node in ast.walk(cls)
        if isinstance(node, ast.Name)
    }
    builders = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("build_") and n.name not in used
    }
    operations.write_text(_without_nodes(operations.read_text(), gone | builders))
    init = package / "operations" / "__init__.py"
    init.write_text(_without_names(init.read_text(), gone))
    client.write_text(_without_names(client.read_text(), gone))
    return gone


def _base_names(source: str) -> set[str]:
    """The names of the base classes of the classes a module defines."""
    return {
        base.id
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name)
    }


def _without_nodes(source: str, names: set[str]) -> str:
    """A module without its top-level classes and functions named in `names` (decorators too)."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            drop.update(range(first - 1, node.end_lineno or node.lineno))
    result = "".join(line for i, line in enumerate(lines) if i not in drop)
    compile(result, "_operations.py", "exec")  # still Python, or stop here
    return result


def _without_names(source: str, names: set[str]) -> str:
    """A module without the imports of `names`, their entries in __all__, and the statements that
    assign an instance of one (the client's `self.group = GroupOperations(...)`)."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        imported = isinstance(node, ast.ImportFrom) and all(a.name in names for a in node.names)
        made = (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in names
        )
        if imported or made:
            assert isinstance(node, ast.stmt)
            drop.update(range(node.lineno - 1, node.end_lineno or node.lineno))
    listed = {f"{name}," for name in names} | {f'"{name}",' for name in names}
    kept = [line for i, line in enumerate(lines) if i not in drop and line.strip() not in listed]
    result = "".join(kept)
    compile(result, "module", "exec")  # still Python, or stop here
    return result


def strip_debug_information(site: Path) -> list[str]:
    """Strip compiled extensions that carry debug information (when `strip` is installed); the
    modules stripped, to be imported again."""
    strip = shutil.which("strip")
    if strip is None:
        print("prune-venv: no strip; extensions keep their debug information", file=sys.stderr)
        return []
    modules = []
    for path in sorted(site.rglob("*.so")):
        if ".libs" in path.parent.name or DEBUG_SECTION not in path.read_bytes():
            continue  # vendored libraries (patched by auditwheel) are left as they are
        subprocess.run([strip, "--strip-unneeded", str(path)], check=True)
        parts = path.relative_to(site).parts
        modules.append(".".join((*parts[:-1], parts[-1].split(".", 1)[0])))
    return modules


def to_bytecode(site: Path) -> int:
    """Replace each dependency's Python sources by their bytecode beside them (what Python imports
    when no source is there): the image carries one copy of the code, not two, and no process
    compiles it as it starts. Tracebacks through these modules give file and line, no text. A
    source that does not compile stays. The sources replaced."""
    replaced = 0
    for source in sorted(site.rglob("*.py")):
        top = source.relative_to(site).parts[0]
        if top in KEEP_SOURCES or "__pycache__" in source.parts:
            continue
        try:
            py_compile.compile(
                str(source),
                cfile=str(source.with_suffix(".pyc")),
                dfile=str(source),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
        except py_compile.PyCompileError:
            continue
        source.unlink()
        replaced += 1
    for cache in list(site.rglob("__pycache__")):
        if cache.relative_to(site).parts[0] not in KEEP_SOURCES:
            shutil.rmtree(cache)
    return replaced


def check_imports(modules: list[str]) -> None:
    """Import each module in a fresh interpreter (this one's: the environment pruned)."""
    for module in modules:
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"prune-venv: {module} no longer imports:\n{done.stderr[-2000:]}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print("usage: prune-venv.py SITE-PACKAGES", file=sys.stderr)
        return 2
    removed, modules = prune(Path(argv[1]))
    check_imports(modules)
    print(f"prune-venv: {removed / 2**20:.0f} MiB removed; {len(modules)} modules import")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
