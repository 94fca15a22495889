"""What an operator checks before trusting a release, each one held by the files themselves:
the image's last stage needs no shell (so a distroless base, which has none, works there, and
nothing deployed execs one), the webhook keeps a replica through voluntary disruptions, and
every region the docs name has a bundled catalog or says how to refresh one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SHELLS = {"sh", "bash", "dash", "ash", "/bin/sh", "/bin/bash", "/usr/bin/env"}


def _final_stage(containerfile: str) -> list[str]:
    instructions = [
        line.strip()
        for line in re.sub(r"\\\n", " ", containerfile).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    last = max(i for i, line in enumerate(instructions) if line.upper().startswith("FROM "))
    return instructions[last:]


def test_the_images_last_stage_runs_nothing_through_a_shell() -> None:
    stage = _final_stage((ROOT / "Containerfile").read_text())
    keywords = {line.split()[0].upper() for line in stage}
    assert "FROM" in keywords and "COPY" in keywords
    assert not keywords & {"RUN", "SHELL"}, stage  # only COPY, ENV, LABEL, USER, ...
    (entrypoint,) = [line for line in stage if line.upper().startswith("ENTRYPOINT")]
    assert entrypoint.split(None, 1)[1].startswith("["), "exec form: no /bin/sh -c"


def _workloads() -> list[dict[str, Any]]:
    found = []
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Deployment", "DaemonSet", "CronJob"):
                found.append(doc)
    return found


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    pod = spec["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_nothing_deployed_execs_a_shell() -> None:
    workloads = _workloads()
    assert {"Deployment", "DaemonSet", "CronJob"} <= {w["kind"] for w in workloads}
    for doc in workloads:
        for container in _containers(doc):
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            assert not SHELLS & set(container.get("command", [])), where
            assert not SHELLS & set(container.get("args", [])[:1]), where
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                assert "exec" not in container.get(probe, {}), f"{where} {probe}"


def test_a_drain_never_takes_the_last_webhook_replica() -> None:
    folder = ROOT / "config" / "deploy" / "webhook"
    pdb = yaml.safe_load((folder / "pdb.yaml").read_text())
    deployment = yaml.safe_load((folder / "deployment.yaml").read_text())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert "pdb.yaml" in kustomization["resources"]


AWS = re.compile(
    r"\b(?:us|eu|ap|ca|sa|me|af|il|mx)-(?:gov-)?"
    r"(?:east|west|north|south|central|northeast|southeast|southwest|northwest)-\d\b"
)
GCP = re.compile(
    r"\b(?:us|europe|asia|australia|northamerica|southamerica|me|africa)-"
    r"(?:east|west|central|north|south|northeast|southeast|southwest|northwest)\d\b"
)
AZURE = re.compile(
    r"\b(?:(?:east|west|central|north|south|northcentral|southcentral|westcentral)us\d?"
    r"|(?:west|north)europe|uk(?:south|west)|francecentral|germanywestcentral|swedencentral"
    r"|switzerlandnorth|norwayeast|japan(?:east|west)|korea(?:central|south)"
    r"|australia(?:east|southeast|central)|southeastasia|eastasia|canada(?:central|east)"
    r"|brazilsouth|southafricanorth|uaenorth|(?:central|south|west)india|italynorth"
    r"|polandcentral|qatarcentral|israelcentral|mexicocentral|spaincentral)\b"
)
HINTS = ("catalog refresh", "catalog-refresh", "#other-regions", "--live")


def test_every_region_the_docs_name_has_a_catalog_or_a_refresh_hint() -> None:
    snapshots = {p.stem for p in (ROOT / "providers" / "snapshots").glob("*.json")}
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    named: list[tuple[str, str]] = []
    for doc in docs:
        for paragraph in re.split(r"\n\s*\n", doc.read_text()):
            for cloud, pattern in (("aws", AWS), ("gcp", GCP), ("azure", AZURE)):
                for region in pattern.findall(paragraph):
                    named.append((cloud, region))
                    if f"{cloud}-{region}" not in snapshots:
                        assert any(h in paragraph for h in HINTS), (
                            f"{doc.name}: {cloud} {region} has no bundled catalog and the "
                            "paragraph naming it says nothing of refreshing one"
                        )
    clouds = {cloud for cloud, _ in named}
    assert clouds == {"aws", "gcp", "azure"}, named  # the scan finds what the docs name
    assert any(f"{c}-{r}" not in snapshots for c, r in named)  # and the hint rule is exercised


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; kubectl refuses the file: so do we."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    repeated = {k for k in keys if keys.count(k) > 1}
    if repeated:
        raise yaml.constructor.ConstructorError(
            None, None, f"keys defined twice: {sorted(map(str, repeated))}", node.start_mark
        )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def test_no_manifest_defines_a_key_twice() -> None:
    files = sorted((ROOT / "config").rglob("*.yaml"))
    assert len(files) > 20
    for path in files:
        list(yaml.load_all(path.read_text(), Loader=_StrictLoader))  # raises on a repeated key
    twice = "a: 1\nb: 2\na: 3\n"
    try:
        yaml.load(twice, Loader=_StrictLoader)
    except yaml.constructor.ConstructorError as exc:
        assert "keys defined twice: ['a']" in str(exc)
    else:
        raise AssertionError("a repeated key went through")
