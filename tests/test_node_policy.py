"""config/deploy/adaptor/node-policy.yaml: the adaptor's ServiceAccount may change only the Node
its pod runs on. Its CEL expressions evaluated here by cel-python on the requests the API server
would build (tests/peers/test_node_policy.py runs the policy in a real kube-apiserver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

POLICY_FILE = (
    Path(__file__).resolve().parents[1] / "config" / "deploy" / "adaptor" / "node-policy.yaml"
)
POLICY, BINDING = yaml.safe_load_all(POLICY_FILE.read_text())
ADAPTOR = "system:serviceaccount:peerpods-system:peerpods-adaptor"
NODE_KEY = "authentication.kubernetes.io/node-name"


def _run(expression: str, request: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({"request": celpy.json_to_cel(request)})


def _request(
    name: str, username: str = ADAPTOR, extra: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    user: dict[str, Any] = {"username": username, "groups": ["system:serviceaccounts"]}
    if extra is not None:
        user["extra"] = extra
    return {"name": name, "operation": "UPDATE", "subResource": "status", "userInfo": user}


def _decision(request: dict[str, Any]) -> str:
    """What the API server does with the request: skip (not matched), allow or deny."""
    for condition in POLICY["spec"]["matchConditions"]:
        if not _run(condition["expression"], request):
            return "skip"
    for validation in POLICY["spec"]["validations"]:
        if not _run(validation["expression"], request):
            return "deny"
    return "allow"


def test_the_adaptor_may_patch_its_own_nodes_status() -> None:
    assert _decision(_request("node-a", extra={NODE_KEY: ["node-a"]})) == "allow"


@pytest.mark.parametrize(
    "extra",
    [
        {NODE_KEY: ["node-a"]},  # its pod runs on node-a
        {NODE_KEY: ["node-a", "node-b"]},  # never more than one node
        {"authentication.kubernetes.io/pod-name": ["adaptor-x"]},  # a token of no node
        {},
        None,  # no extra at all (a token not bound to a pod)
    ],
    ids=["other-node", "two-nodes", "no-node-key", "empty-extra", "no-extra"],
)
def test_the_adaptor_is_refused_any_other_node(extra: dict[str, list[str]] | None) -> None:
    assert _decision(_request("node-b", extra=extra)) == "deny"


def test_other_users_are_not_judged_by_it() -> None:
    kubelet = _request("node-b", username="system:node:node-b")
    assert _decision(kubelet) == "skip"
    other_sa = _request("node-b", username="system:serviceaccount:peerpods-system:other")
    assert _decision(other_sa) == "skip"


def test_the_message_names_the_node() -> None:
    (validation,) = POLICY["spec"]["validations"]
    message = _run(validation["messageExpression"], _request("node-b", extra={}))
    assert str(message) == "the peerpods adaptor may change only its own node, not node-b"


def test_it_covers_what_the_adaptors_role_grants_and_is_enforced() -> None:
    rules = POLICY["spec"]["matchConstraints"]["resourceRules"]
    covered = {r for rule in rules for r in rule["resources"]}
    role_file = POLICY_FILE.with_name("rbac.yaml")
    role = next(d for d in yaml.safe_load_all(role_file.read_text()) if d["kind"] == "ClusterRole")
    writes = {
        r
        for rule in role["rules"]
        if set(rule["verbs"]) - {"get", "list", "watch"}
        for r in rule["resources"]
    }
    assert writes <= covered
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    assert BINDING["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert BINDING["spec"]["validationActions"] == ["Deny"]
    sa = next(d for d in yaml.safe_load_all(role_file.read_text()) if d["kind"] == "ServiceAccount")
    assert (
        f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}" == ADAPTOR
    )
