"""Write the least-privilege cloud permissions the adaptor needs, from the calls its code makes.

    python scripts/gen_permissions.py           # (re)write config/permissions/*
    python scripts/gen_permissions.py --check   # exit 1 when a file is not what the code needs

The calls are found by reading the source (an AST scan: the providers, the catalog loaders, the
price sources and anything else that calls a cloud), checked against each SDK's own list of
operations, never listed by hand. What *is* written by hand is the table saying which permissions
one call needs (a launch also tags, a VM PUT also creates its NIC and disk): a call found in the
code with no entry in it, or an entry no call uses, is an error, so the files change whenever the
calls do.

Found per cloud, in every module of adaptor/, providers/ and webhook/ (GCP: the modules that make
compute_v1 clients):
- AWS: any name in a module (an attribute or a string, since calls go through
  `getattr(client, "run_instances")`) that is an EC2 or Service Quotas operation in botocore's
  service models.
- Azure: attribute chains `<x>.<operation group>.<method>` whose group is one of the compute or
  network management clients' operation groups and whose method that group has.
- GCP: `<x>.<receiver>.<method>` for the receivers each module gives its compute_v1 clients
  (RECEIVERS, checked against the clients the module constructs), and string constants naming a
  method of a module's only client (calls made through `getattr(self.client, method)`).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from providers.core.base import TAG_OWNER  # noqa: E402

OUT = ROOT / "config" / "permissions"
FILES = {"aws": "aws-iam-policy.json", "azure": "azure-role.json", "gcp": "gcp-role.yaml"}
PACKAGES = ("adaptor", "providers", "webhook")


def package_modules() -> tuple[str, ...]:
    """Every module of the three packages (generated protobuf code aside)."""
    found = (p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py")))
    return tuple(str(p.relative_to(ROOT)) for p in found if "/gen/" not in p.as_posix())


# AWS and Azure calls have names no other code uses, so every module is read; GCP's (`get`,
# `list`) need the receiver, so only the modules that construct compute_v1 clients (RECEIVERS).
MODULES = {"aws": package_modules(), "azure": package_modules()}

# --- which permissions each call needs (the only hand-written part) ----------------------------

AWS: dict[str, tuple[str, ...]] = {
    "DeleteVolume": ("ec2:DeleteVolume",),  # a purged VM's volumes, when EC2 left them
    "DescribeSpotPriceHistory": ("ec2:DescribeSpotPriceHistory",),  # catalog refresh
    "DescribeInstanceTypeOfferings": ("ec2:DescribeInstanceTypeOfferings",),
    "DescribeInstanceTypes": ("ec2:DescribeInstanceTypes",),
    "DescribeInstances": ("ec2:DescribeInstances",),
    "DescribeImages": ("ec2:DescribeImages",),
    "DescribeSubnets": ("ec2:DescribeSubnets",),
    "DescribeVolumes": ("ec2:DescribeVolumes",),
    # TagSpecifications at launch need CreateTags, allowed below only as part of RunInstances.
    "RunInstances": ("ec2:RunInstances", "ec2:CreateTags"),
    "TerminateInstances": ("ec2:TerminateInstances",),
    # warm pools (adaptor.warmpool): a warm VM is stopped once ready, and adopted by writing the
    # pod's user data while stopped, moving it from the pool's tags to the sandbox's, starting it
    "StopInstances": ("ec2:StopInstances",),
    "StartInstances": ("ec2:StartInstances",),
    "ModifyInstanceAttribute": ("ec2:ModifyInstanceAttribute",),
    "CreateTags": ("ec2:CreateTags",),
    "DeleteTags": ("ec2:DeleteTags",),
    # the account's vCPU quotas, read for ranking (providers.clouds.quotas)
    "GetServiceQuota": ("servicequotas:GetServiceQuota",),
}
# Conditions narrowing an action: tags while launching, or on what carries the owner tag (a
# warm VM's adoption); terminate, stop, start, modify and delete only what carries the owner
# tag (instances and volumes are tagged at launch). An action with several conditions is
# allowed under any of them (one statement each).
_OWNED = {"Null": {f"aws:ResourceTag/{TAG_OWNER}": "false"}}
AWS_CONDITIONS: dict[str, list[dict[str, Any]]] = {
    "ec2:CreateTags": [{"StringEquals": {"ec2:CreateAction": "RunInstances"}}, _OWNED],
    "ec2:DeleteTags": [_OWNED],
    "ec2:DeleteVolume": [_OWNED],
    "ec2:ModifyInstanceAttribute": [_OWNED],
    "ec2:StartInstances": [_OWNED],
    "ec2:StopInstances": [_OWNED],
    "ec2:TerminateInstances": [_OWNED],
}

# Polling a begin_* operation reads the provider's operation status.
_AZURE_LRO = "Microsoft.Compute/locations/operations/read"
_AZURE_NETWORK_LRO = "Microsoft.Network/locations/operations/read"
AZURE: dict[str, tuple[str, ...]] = {
    # The VM is PUT with its NIC and OS disk inline (deleteOption Delete), from an image.
    "compute.virtual_machines.begin_create_or_update": (
        "Microsoft.Compute/virtualMachines/write",
        "Microsoft.Compute/disks/write",
        "Microsoft.Compute/images/read",
        "Microsoft.Compute/galleries/images/versions/read",
        "Microsoft.Network/networkInterfaces/write",
        "Microsoft.Network/networkInterfaces/join/action",
        "Microsoft.Network/virtualNetworks/subnets/join/action",
        _AZURE_LRO,
    ),
    "compute.virtual_machines.begin_delete": (
        "Microsoft.Compute/virtualMachines/delete",
        "Microsoft.Compute/disks/delete",
        "Microsoft.Network/networkInterfaces/delete",
        _AZURE_LRO,
    ),
    # A purged VM's NIC and OS disk, when an eviction or a failure left them.
    "compute.disks.begin_delete": ("Microsoft.Compute/disks/delete", _AZURE_LRO),
    "network.network_interfaces.begin_delete": (
        "Microsoft.Network/networkInterfaces/delete",
        _AZURE_NETWORK_LRO,
    ),
    # The warm pool: a ready VM is deallocated, then adopted by a PATCH of its user data and
    # tags while deallocated, and started.
    "compute.virtual_machines.begin_deallocate": (
        "Microsoft.Compute/virtualMachines/deallocate/action",
        _AZURE_LRO,
    ),
    "compute.virtual_machines.begin_update": (
        "Microsoft.Compute/virtualMachines/write",
        _AZURE_LRO,
    ),
    "compute.virtual_machines.begin_start": (
        "Microsoft.Compute/virtualMachines/start/action",
        _AZURE_LRO,
    ),
    "compute.virtual_machines.get": ("Microsoft.Compute/virtualMachines/read",),
    "compute.virtual_machines.list": ("Microsoft.Compute/virtualMachines/read",),
    "compute.resource_skus.list": ("Microsoft.Compute/skus/read",),
    "compute.usage.list": ("Microsoft.Compute/locations/usages/read",),  # account quotas
    "network.network_interfaces.get": ("Microsoft.Network/networkInterfaces/read",),
}

_GCE_WAIT = "compute.zoneOperations.get"  # ExtendedOperation.result() polls the zone operation
GCP: dict[str, tuple[str, ...]] = {
    # insert: a boot disk from an image, with labels and metadata (user data), on a subnetwork,
    # optionally with an external address (--gcp-use-public-ip).
    "InstancesClient.insert": (
        "compute.instances.create",
        "compute.instances.setLabels",
        "compute.instances.setMetadata",
        "compute.disks.create",
        "compute.disks.setLabels",
        "compute.images.useReadOnly",
        "compute.subnetworks.use",
        "compute.subnetworks.useExternalIp",
        _GCE_WAIT,
    ),
    "InstancesClient.delete": ("compute.instances.delete", _GCE_WAIT),
    # warm pools (adaptor.warmpool): stopped once ready; adopted by replacing the metadata (the
    # pod's user data) and the labels while stopped, then started
    "InstancesClient.stop": ("compute.instances.stop", _GCE_WAIT),
    "InstancesClient.start": ("compute.instances.start", _GCE_WAIT),
    "InstancesClient.set_metadata": ("compute.instances.setMetadata", _GCE_WAIT),
    "InstancesClient.set_labels": ("compute.instances.setLabels", _GCE_WAIT),
    "InstancesClient.get": ("compute.instances.get",),
    "InstancesClient.aggregated_list": ("compute.instances.list",),
    "RegionsClient.get": ("compute.regions.get",),
    "MachineTypesClient.list": ("compute.machineTypes.list",),
    "AcceleratorTypesClient.list": ("compute.acceleratorTypes.list",),
}
TABLES: dict[str, dict[str, tuple[str, ...]]] = {"aws": AWS, "azure": AZURE, "gcp": GCP}

# The name each GCP module gives its clients: `self.client.insert`, `clients.regions.get`.
RECEIVERS: dict[str, dict[str, str]] = {
    "providers/clouds/gcp.py": {"client": "InstancesClient"},
    "providers/clouds/quotas.py": {"regions": "RegionsClient"},
    "providers/clouds/loaders/gcp.py": {
        "regions": "RegionsClient",
        "machine_types": "MachineTypesClient",
        "accelerator_types": "AcceleratorTypesClient",
    },
}


class ScanError(Exception):
    """The code and the permission table disagree."""


# --- finding the calls --------------------------------------------------------------------------


def _tree(module: str) -> ast.Module:
    return ast.parse((ROOT / module).read_text(), filename=module)


def _names(tree: ast.AST) -> Iterator[str]:
    """Every attribute name and string constant in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _chains(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(receiver, method) for every `<...>.<receiver>.<method>` or `<receiver>.<method>`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Attribute):
            yield value.attr, node.attr
        elif isinstance(value, ast.Name):
            yield value.id, node.attr


@cache
def _ec2_operations() -> dict[str, str]:
    """EC2's and Service Quotas' operations by their boto3 method name (run_instances ->
    RunInstances)."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    return {
        xform_name(op): op
        for service in ("ec2", "service-quotas")
        for op in session.get_service_model(service).operation_names
    }


def aws_calls() -> set[str]:
    operations = _ec2_operations()
    return {operations[n] for m in MODULES["aws"] for n in _names(_tree(m)) if n in operations}


class _NoCredential:
    def get_token(self, *_: Any, **__: Any) -> Any:  # never called: nothing is sent
        raise RuntimeError("no credential")


@cache
def _azure_groups() -> dict[str, tuple[str, set[str]]]:
    """Operation group -> (client, its public methods) of the compute and network clients."""
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient

    groups: dict[str, tuple[str, set[str]]] = {}
    for client_name, cls in (
        ("compute", ComputeManagementClient),
        ("network", NetworkManagementClient),
    ):
        client = cls(_NoCredential(), "00000000-0000-0000-0000-000000000000")
        for attr, ops in vars(client).items():
            if type(ops).__name__.endswith("Operations") and attr != "operations":
                methods = {m for m in dir(type(ops)) if not m.startswith("_")}
                groups.setdefault(attr, (client_name, methods))
    return groups


def azure_calls() -> set[str]:
    groups = _azure_groups()
    found = set()
    for module in MODULES["azure"]:
        for group, method in _chains(_tree(module)):
            if group in groups and method in groups[group][1]:
                found.add(f"{groups[group][0]}.{group}.{method}")
    return found


def _gcp_methods(class_name: str) -> set[str]:
    from google.cloud import compute_v1

    cls = getattr(compute_v1, class_name)
    return {
        name
        for name, value in vars(cls).items()
        if callable(value)
        and not name.startswith(("_", "common_", "parse_"))
        and not name.endswith("_path")
    }


def _constructed(tree: ast.AST) -> set[str]:
    """compute_v1 client classes the module constructs: `compute_v1.InstancesClient()` (or
    `compute.RegionsClient()`, the module imported under another name)."""
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.attr.endswith("Client")
        and node.func.attr in _gcp_clients()
    }


@cache
def _gcp_clients() -> frozenset[str]:
    from google.cloud import compute_v1

    return frozenset(name for name in dir(compute_v1) if name.endswith("Client"))


def gcp_calls() -> set[str]:
    makers = {m for m in package_modules() if _constructed(_tree(m))}
    if makers != set(RECEIVERS):
        raise ScanError(
            f"gcp: modules making compute_v1 clients {sorted(makers)} "
            f"but RECEIVERS covers {sorted(RECEIVERS)}"
        )
    found = set()
    for module in RECEIVERS:
        tree = _tree(module)
        receivers = RECEIVERS.get(module, {})
        made = _constructed(tree)
        if set(receivers.values()) != made:
            named = sorted(receivers.values())
            raise ScanError(f"{module} constructs {sorted(made)} but RECEIVERS names {named}")
        for receiver, method in _chains(tree):
            if receiver in receivers and method in _gcp_methods(receivers[receiver]):
                found.add(f"{receivers[receiver]}.{method}")
        if len(made) == 1:  # getattr(self.client, "insert"): a string naming one of its methods
            (only,) = made
            methods = _gcp_methods(only)
            found |= {
                f"{only}.{n}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(n := node.value, str)
                if n in methods
            }
    return found


def calls(cloud: str) -> set[str]:
    """Every cloud API call the providers and catalog loaders of `cloud` make."""
    return {"aws": aws_calls, "azure": azure_calls, "gcp": gcp_calls}[cloud]()


def permissions(cloud: str) -> set[str]:
    """The permissions those calls need; ScanError when the table and the code disagree."""
    found, table = calls(cloud), TABLES[cloud]
    unknown = sorted(found - set(table))
    if unknown:
        raise ScanError(f"{cloud}: calls with no permission entry: {', '.join(unknown)}")
    unused = sorted(set(table) - found)
    if unused:
        raise ScanError(f"{cloud}: permission entries no call uses: {', '.join(unused)}")
    return {p for call in found for p in table[call]}


# --- the files ----------------------------------------------------------------------------------


def render_aws(actions: Iterable[str]) -> str:
    actions = sorted(actions)
    plain = [a for a in actions if a not in AWS_CONDITIONS]
    statements: list[dict[str, Any]] = [
        {"Sid": "PeerpodsPodVMs", "Effect": "Allow", "Action": plain, "Resource": "*"}
    ]
    for action in (a for a in actions if a in AWS_CONDITIONS):
        conditions = AWS_CONDITIONS[action]
        for n, condition in enumerate(conditions):
            suffix = "" if n == 0 else str(n + 1)
            statements.append(
                {
                    "Sid": "Peerpods" + action.split(":", 1)[1] + suffix,
                    "Effect": "Allow",
                    "Action": [action],
                    "Resource": "*",
                    "Condition": condition,
                }
            )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, indent=2) + "\n"


def render_azure(actions: Iterable[str]) -> str:
    role = {
        "Name": "peerpods adaptor",
        "IsCustom": True,
        "Description": "What the peerpods adaptor needs to run pod VMs in one resource group "
        "(generated by scripts/gen_permissions.py from the calls the code makes).",
        "Actions": sorted(actions),
        "NotActions": [],
        "DataActions": [],
        "NotDataActions": [],
        "AssignableScopes": [
            "/subscriptions/SUBSCRIPTION_ID/resourceGroups/RESOURCE_GROUP",
        ],
    }
    return json.dumps(role, indent=2) + "\n"


def render_gcp(permissions: Iterable[str]) -> str:
    lines = [
        "# gcloud iam roles create peerpods_adaptor --project=PROJECT --file=gcp-role.yaml",
        "# Generated by scripts/gen_permissions.py from the calls the code makes.",
        "title: peerpods adaptor",
        "description: What the peerpods adaptor needs to run pod VMs and list machine types.",
        "stage: GA",
        "includedPermissions:",
        *(f"  - {p}" for p in sorted(permissions)),
    ]
    return "\n".join(lines) + "\n"


RENDER = {"aws": render_aws, "azure": render_azure, "gcp": render_gcp}


def read_file(cloud: str) -> set[str]:
    """The permissions a written file grants (what the test compares with the code)."""
    text = (OUT / FILES[cloud]).read_text()
    if cloud == "aws":
        return {a for s in json.loads(text)["Statement"] for a in s["Action"]}
    if cloud == "azure":
        return set(json.loads(text)["Actions"])
    import yaml

    return set(yaml.safe_load(text)["includedPermissions"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for cloud, name in FILES.items():
        text = RENDER[cloud](permissions(cloud))
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date (run scripts/gen_permissions.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
