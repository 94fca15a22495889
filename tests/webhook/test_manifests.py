"""The webhook deploy manifests: valid Kubernetes objects with the settings admission needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DIR = Path(__file__).resolve().parents[2] / "config" / "deploy" / "webhook"
DOCS = [d for p in sorted(DIR.glob("*.yaml")) if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text()) if d]  # fmt: skip


def _one(kind: str) -> dict[str, Any]:
    return next(d for d in DOCS if d["kind"] == kind)


@pytest.mark.parametrize("doc", DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCS])
def test_valid(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("cert-manager.io/"):
        assert doc["spec"]
        return
    kubernetes_validate.validate(doc, "1.34", strict=True)


def test_webhook_configuration() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["sideEffects"] == "None" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail" and 1 <= hook["timeoutSeconds"] <= 30
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn"
    assert {"kube-system", "peerpods-system"} <= set(excluded["values"])


def test_deployment_and_rbac() -> None:
    deployment = _one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["webhook"]
    rules = _one("ClusterRole")["rules"]
    assert rules == [{"apiGroups": ["resource.k8s.io"],
                      "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
                      "verbs": ["get"]}]  # fmt: skip
    certificate = next(d for d in DOCS if d["kind"] == "Certificate" and not d["spec"].get("isCA"))
    assert "peerpods-webhook.peerpods-system.svc" in certificate["spec"]["dnsNames"]


def test_only_peer_pods_reach_the_webhook() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    (condition,) = hook["matchConditions"]
    assert "object.spec.runtimeClassName in ['kata-remote']" in condition["expression"]
    deployment = _one("Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PEERPODS_RUNTIME_CLASSES"] == "kata-remote"  # the same list


def test_network_policy_admits_only_https_from_outside_the_pod_network() -> None:
    policy = _one("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "peerpods-webhook"
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api_server, monitoring = policy["spec"]["ingress"]
    assert api_server["ports"] == [{"protocol": "TCP", "port": 8443}]
    (peer,) = api_server["from"]
    assert peer["ipBlock"]["except"]  # the pod network never reaches /mutate
    # Prometheus' scrapes: its pods in the monitoring namespace only (both selectors in one
    # peer: a pod must match both), the HTTPS port only
    assert monitoring["ports"] == [{"protocol": "TCP", "port": 8443}]
    (scraper,) = monitoring["from"]
    assert scraper == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }


def test_updates_reach_the_webhook() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def test_cel_workers_can_start_on_a_read_only_root() -> None:
    spec = _one("Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the forkserver's socket directory


def _named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_serving_certificate_is_signed_by_a_ca_whose_bundle_is_injected() -> None:
    """self-signed Issuer -> CA Certificate -> CA Issuer -> serving certificate; the caBundle is
    the CA's, so a renewed serving certificate never changes what the API server trusts."""
    hook = _one("MutatingWebhookConfiguration")
    namespace, ca_name = hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split(
        "/"
    )
    ca = _named("Certificate", ca_name)
    assert ca["metadata"]["namespace"] == namespace and ca["spec"]["isCA"] is True
    root = _named("Issuer", ca["spec"]["issuerRef"]["name"])
    assert root["spec"] == {"selfSigned": {}}
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"  # renewed CA, same key
    (ca_issuer,) = [
        d
        for d in DOCS
        if d["kind"] == "Issuer"
        and d["spec"].get("ca", {}).get("secretName") == ca["spec"]["secretName"]
    ]
    deployment = _one("Deployment")
    tls = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    (leaf,) = [
        d
        for d in DOCS
        if d["kind"] == "Certificate" and d["spec"]["secretName"] == tls["secret"]["secretName"]
    ]
    assert leaf["spec"]["issuerRef"] == {"kind": "Issuer", "name": ca_issuer["metadata"]["name"]}
    assert not leaf["spec"].get("isCA")
    hours = {c["metadata"]["name"]: int(c["spec"]["duration"].rstrip("h")) for c in (ca, leaf)}
    assert hours[ca_name] >= 10 * hours[leaf["metadata"]["name"]]


def test_a_renewed_serving_certificate_verifies_against_the_injected_bundle() -> None:
    """What the chain above buys, with real certificates: the bundle made once from the CA
    verifies the first serving certificate, its renewal (a new key), and both again after the
    CA certificate itself is renewed with its key kept."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from cryptography.x509.verification import PolicyBuilder, Store

    host = "peerpods-webhook.peerpods-system.svc"
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peerpods-webhook-ca")])

    def ca_cert(serial: int) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )

    def leaf(serial: int) -> x509.Certificate:
        key = ec.generate_private_key(ec.SECP256R1())  # rotationPolicy: Always
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=90))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )

    def verifies(bundle: x509.Certificate, served: x509.Certificate) -> bool:
        verifier = PolicyBuilder().store(Store([bundle])).build_server_verifier(x509.DNSName(host))
        try:
            verifier.verify(served, [])
        except x509.verification.VerificationError:
            return False
        return True

    bundle = ca_cert(1)  # injected once
    first, renewed = leaf(10), leaf(11)
    assert verifies(bundle, first) and verifies(bundle, renewed)
    renewed_ca = ca_cert(2)
    assert verifies(renewed_ca, first) and verifies(renewed_ca, renewed)
    # and the check can fail: a serving certificate of another CA (another key) is refused
    other = ec.generate_private_key(ec.SECP256R1())
    ca_key, kept = other, ca_key
    stranger = leaf(12)
    ca_key = kept
    assert not verifies(bundle, stranger)
