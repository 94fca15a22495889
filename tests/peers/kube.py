"""A real Kubernetes control plane on loopback for the real-peers suite.

`KubeCluster` starts etcd and kube-apiserver (and, if asked, kube-scheduler) from prebuilt
binaries, each in a temporary folder with its own free loopback ports, and stops them all on exit.
It makes its own PKI: a CA, the apiserver's serving certificate, a service-account signing key and
client certificates (an admin in `system:masters`, the scheduler, and nodes on demand), so tests
can act as an admin, as a node (for NodeRestriction) or with a pod- or node-bound ServiceAccount
token. `start_kubelet` runs a kubelet against it with a container runtime the caller provides.

Nothing here fetches or builds anything: binaries come from `peer_binary` (PEERPODS_PEERS_DIR).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.peers.conftest import peer_binary

ADMISSION_PLUGINS = (
    "NodeRestriction",
    "ResourceQuota",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
)
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ClusterError(RuntimeError):
    """A control-plane process did not start, became not ready or died."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- PKI -------------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class Pki:
    """A throwaway CA that signs serving and client certificates into `folder`."""

    folder: Path
    _key: ec.EllipticCurvePrivateKey = field(init=False)
    _cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peerpods-test-ca")])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def ca_path(self) -> Path:
        return self.folder / "ca.crt"

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        client: bool = True,
    ) -> tuple[Path, Path]:
        """Write `<stem>.crt` and `<stem>.key`; server_names make it a serving certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            sans: list[x509.GeneralName] = []
            for item in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(item)))
                except ValueError:
                    sans.append(x509.DNSName(item))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        key_path.chmod(0o600)
        return cert_path, key_path

    def service_account_keys(self) -> tuple[Path, Path]:
        """An RSA key pair the apiserver signs and verifies ServiceAccount tokens with."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private, public = self.folder / "sa.key", self.folder / "sa.pub"
        private.write_bytes(_pem_key(key))
        private.chmod(0o600)
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return private, public


# --- processes -------------------------------------------------------------------------------


@dataclass
class Process:
    """One started binary, its log file and how to stop it (its own process group)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_seconds: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL whatever is left after the grace period."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace_seconds)
        # The group may hold children (a kubelet's, etcd's) even after the leader exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


def start_process(name: str, argv: list[str], log_path: Path) -> Process:
    """Start `argv` in a new session with stdout and stderr going to `log_path`."""
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(name, popen, log_path)


def wait_until(
    what: str, check: Callable[[], bool], timeout_seconds: float, process: Process
) -> None:
    """Poll `check` until it holds; raise ClusterError with the log tail on timeout or death."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if not process.alive():
            raise ClusterError(
                f"{process.name} exited while waiting for {what}:\n{process.log_tail()}"
            )
        with contextlib.suppress(OSError, ssl.SSLError, urllib.error.URLError):
            if check():
                return
        time.sleep(0.25)
    raise ClusterError(f"timed out waiting for {what}:\n{process.log_tail()}")


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> Path:
    """A one-cluster, one-user kubeconfig (JSON is valid YAML) with file references."""
    credentials: dict[str, str] = {}
    if cert is not None and key is not None:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
    return path


# --- the cluster -----------------------------------------------------------------------------


@dataclass
class KubeCluster:
    """etcd + kube-apiserver (+ kube-scheduler) on loopback; a context manager.

    `with KubeCluster(scheduler=True) as cluster:` yields a ready control plane; leaving the block
    stops every process it started and removes its folder.
    """

    scheduler: bool = False
    extra_apiserver_args: tuple[str, ...] = ()
    ready_timeout_seconds: float = 120.0
    folder: Path = field(init=False)
    base_url: str = field(init=False)
    pki: Pki = field(init=False)
    admin_kubeconfig: Path = field(init=False)
    admin_token: str = field(init=False)
    processes: list[Process] = field(init=False, default_factory=list)
    _ssl: ssl.SSLContext = field(init=False)

    @property
    def ca_path(self) -> Path:
        return self.pki.ca_path

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="peerpods-kube-"))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.processes = []
        pki_dir = self.folder / "pki"
        pki_dir.mkdir(mode=0o700)
        self.pki = Pki(pki_dir)
        etcd_url = self._start_etcd()
        port = free_port()
        self.base_url = f"https://127.0.0.1:{port}"
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "127.0.0.1",
                "localhost",
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            client=False,
        )
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        )
        front_proxy = self.pki.issue("front-proxy-client", "front-proxy-client")
        sa_key, sa_pub = self.pki.service_account_keys()
        self.admin_token = os.urandom(16).hex()
        tokens = pki_dir / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        tokens.chmod(0o600)
        argv = [
            str(peer_binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={pki_dir}",
            f"--tls-cert-file={serving[0]}",
            f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.pki.ca_path}",
            f"--kubelet-client-certificate={kubelet_client[0]}",
            f"--kubelet-client-key={kubelet_client[1]}",
            f"--kubelet-certificate-authority={self.pki.ca_path}",
            f"--token-auth-file={tokens}",
            # Front-proxy settings: aggregated APIs work, and the scheduler's authentication
            # finds a request-header CA in kube-system/extension-apiserver-authentication.
            f"--requestheader-client-ca-file={self.pki.ca_path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front_proxy[0]}",
            f"--proxy-client-key-file={front_proxy[1]}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
            "--allow-privileged=true",
            # The endpoint reconciler refuses a loopback advertise address; nothing needs it.
            "--endpoint-reconciler-type=none",
            *self.extra_apiserver_args,
        ]
        apiserver = start_process("kube-apiserver", argv, self.folder / "kube-apiserver.log")
        self.processes.append(apiserver)
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca_path))
        wait_until(
            "kube-apiserver /readyz",
            lambda: self._status("/readyz") == 200,
            self.ready_timeout_seconds,
            apiserver,
        )
        admin = self.pki.issue("admin", "admin", organizations=("system:masters",))
        self.admin_kubeconfig = write_kubeconfig(
            self.folder / "admin.kubeconfig", self.base_url, self.pki.ca_path, "admin", *admin
        )
        # No controller-manager runs: the "default" ServiceAccount pods fall back to is made here.
        self.ensure_namespace("default")
        if self.scheduler:
            self._start_scheduler()

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        data = self.folder / "etcd"
        data.mkdir(mode=0o700)
        argv = [
            str(peer_binary("etcd")),
            "--name=default",
            f"--data-dir={data}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--listen-metrics-urls=",
            "--log-level=warn",
        ]
        env_free = start_process("etcd", argv, self.folder / "etcd.log")
        self.processes.append(env_free)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as response:
                body: dict[str, Any] = json.load(response)
            return body.get("health") == "true"

        wait_until("etcd /health", healthy, 60.0, env_free)
        return client_url

    def _start_scheduler(self) -> None:
        cert, key = self.pki.issue("scheduler", "system:kube-scheduler")
        kubeconfig = write_kubeconfig(
            self.folder / "scheduler.kubeconfig",
            self.base_url,
            self.pki.ca_path,
            "system:kube-scheduler",
            cert,
            key,
        )
        argv = [
            str(peer_binary("kube-scheduler")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
        ]
        self.processes.append(
            start_process("kube-scheduler", argv, self.folder / "kube-scheduler.log")
        )

    def stop(self) -> None:
        """Stop every process, newest first, and remove the folder."""
        for process in reversed(self.processes):
            process.stop()
        self.processes = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def process(self, name: str) -> Process:
        """The started process called `name` (kube-apiserver, etcd, kube-scheduler)."""
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(name)

    # --- clients ---------------------------------------------------------------------------

    def _status(self, path: str) -> int:
        request = urllib.request.Request(self.base_url + path)
        request.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=5) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code

    def api_request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> Any:
        """Call the API as admin (or with `token`) and return the decoded JSON answer.

        Raises urllib.error.HTTPError for an error status; its body holds the Status object.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token or self.admin_token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            content_type = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self._ssl, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def api_get(self, path: str, *, token: str | None = None) -> Any:
        return self.api_request("GET", path, token=token)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the prebuilt kubectl against this cluster (admin unless `kubeconfig`)."""
        argv = [str(peer_binary("kubectl")), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}"]
        return subprocess.run(
            [*argv, *args], input=input, capture_output=True, text=True, check=check, timeout=120
        )

    def apply(self, yaml_text: str) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` with `yaml_text`; raises CalledProcessError when refused."""
        return self.kubectl("apply", "-f", "-", input=yaml_text)

    def ensure_namespace(self, name: str) -> None:
        """Create namespace `name`, its "default" ServiceAccount and CA ConfigMaps if missing.

        Without kube-controller-manager nobody else creates that account, and the ServiceAccount
        admission plugin refuses pods whose account does not exist.
        """
        objects = [
            (
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            ),
            (
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            ),
        ]
        ca = self.pki.ca_path.read_text()
        # What kube-controller-manager's publishers would put in every namespace; the pods'
        # kube-api-access projected volume needs both (the second is OpenShift's addition).
        for config_map, key in (
            ("kube-root-ca.crt", "ca.crt"),
            ("openshift-service-ca.crt", "service-ca.crt"),
        ):
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": config_map},
                "data": {key: ca},
            }
            objects.append((f"/api/v1/namespaces/{name}/configmaps", body))
        for path, body in objects:
            try:
                self.api_request("POST", path, body)
            except urllib.error.HTTPError as exc:
                if exc.code != 409:  # 409: it exists already
                    raise

    # --- identities ------------------------------------------------------------------------

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig for `system:node:<node_name>` (what the Node authorizer and
        NodeRestriction judge)."""
        cert, key = self.pki.issue(
            f"node-{node_name}", f"system:node:{node_name}", organizations=("system:nodes",)
        )
        return write_kubeconfig(
            self.folder / f"node-{node_name}.kubeconfig",
            self.base_url,
            self.pki.ca_path,
            f"system:node:{node_name}",
            cert,
            key,
        )

    def create_token(
        self,
        namespace: str,
        service_account: str,
        *,
        bound_kind: str | None = None,
        bound_name: str | None = None,
        bound_uid: str | None = None,
        audiences: tuple[str, ...] = (),
        expiration_seconds: int = 3600,
    ) -> str:
        """A ServiceAccount token from the TokenRequest API, bound to a Pod, Node or Secret.

        The bound object must exist; the apiserver fills in its uid when `bound_uid` is None and
        adds the pod's node to a pod-bound token, which is what node-restricted checks read.
        """
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        if bound_kind is not None:
            ref: dict[str, str] = {"kind": bound_kind, "apiVersion": "v1", "name": bound_name or ""}
            if bound_uid is not None:
                ref["uid"] = bound_uid
            spec["boundObjectRef"] = ref
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        answer = self.api_request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            body,
        )
        token: str = answer["status"]["token"]
        return token

    # --- fake nodes ------------------------------------------------------------------------

    def create_fake_node(
        self,
        name: str,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
        extra: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        """A Node object with allocatable resources and a Ready condition, without a kubelet.

        Created by the admin, then its status is written and the not-ready taint removed so the
        scheduler sees it Ready (the heartbeat is never renewed; without kube-controller-manager
        nothing marks it stale).
        """
        resources = {"cpu": cpu, "memory": memory, "pods": pods, **(extra or {})}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
        }
        self.api_request("POST", "/api/v1/nodes", node)
        now = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        self.api_request("PATCH", f"/api/v1/nodes/{name}/status", status)
        self.untaint_node(name)

    def untaint_node(self, name: str) -> None:
        """Drop every taint of Node `name`.

        The TaintNodesByCondition admission plugin gives every new Node the not-ready taint, and
        kube-controller-manager, which would lift it once the node is Ready, does not run here.
        """
        self.api_request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    # --- kubelet ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def kubelet(
        self,
        node_name: str,
        runtime_endpoint: str,
        *,
        cgroup_driver: str = "cgroupfs",
        extra_args: tuple[str, ...] = (),
        config_overrides: dict[str, Any] | None = None,
        register_timeout_seconds: float = 120.0,
    ) -> Iterator[Process]:
        """Run a kubelet for `node_name` against this apiserver until the block ends.

        `runtime_endpoint` is the CRI socket (unix:///run/containerd/containerd.sock); the runtime
        must use the same cgroup driver. The kubelet authenticates as `system:node:<node_name>`
        with a client certificate, so the Node authorizer and NodeRestriction apply to it. Yields
        once its Node is registered.
        """
        with start_kubelet(
            self,
            node_name,
            runtime_endpoint,
            cgroup_driver=cgroup_driver,
            extra_args=extra_args,
            config_overrides=config_overrides,
        ) as process:
            wait_until(
                f"Node {node_name} registered",
                lambda: self._status(f"/api/v1/nodes/{node_name}") == 200,
                register_timeout_seconds,
                process,
            )
            yield process


@contextlib.contextmanager
def start_kubelet(
    cluster: KubeCluster,
    node_name: str,
    runtime_endpoint: str,
    *,
    cgroup_driver: str = "cgroupfs",
    extra_args: tuple[str, ...] = (),
    config_overrides: dict[str, Any] | None = None,
    isolate_kernel_tunables: bool = True,
    node_ip: str | None = None,
) -> Iterator[Process]:
    """Start a kubelet (root dir and config in a temporary folder); stop it and unmount after."""
    folder = Path(tempfile.mkdtemp(prefix=f"peerpods-kubelet-{node_name}-"))
    root = folder / "root"
    root.mkdir()
    serving = cluster.pki.issue(
        f"kubelet-{node_name}-serving",
        f"system:node:{node_name}",
        organizations=("system:nodes",),
        server_names=("127.0.0.1", "localhost", node_name),
    )
    kubeconfig = cluster.node_kubeconfig(node_name)
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": free_port(),
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        "readOnlyPort": 0,
        "cgroupDriver": cgroup_driver,
        "failSwapOn": False,
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cluster.ca_path)},
        },
        "authorization": {"mode": "Webhook"},
        "staticPodPath": "",
        "clusterDomain": "cluster.local",
        "clusterDNS": ["10.96.0.10"],
        "resolvConf": "/dev/null",
        # Test machines run near full disks and memory; do not evict or refuse pods for it.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        # No kubepods hierarchy in the machine's cgroups (several kubelets may share them).
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "containerRuntimeEndpoint": runtime_endpoint,
        "registerNode": True,
        # 1.35+ refuses cgroup v1 hosts unless told otherwise; CI machines may still be v1.
        "failCgroupV1": False,
        # Checked, never written: with isolate_kernel_tunables they read as expected.
        "protectKernelDefaults": isolate_kernel_tunables,
        "podLogsDir": str(folder / "pod-logs"),
        **(config_overrides or {}),
    }
    config_path = folder / "kubelet-config.json"
    config_path.write_text(json.dumps(config, indent=1))
    argv = [
        str(peer_binary("kubelet")),
        f"--config={config_path}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root}",
        f"--hostname-override={node_name}",
        # --node-ip may not be loopback; without it the kubelet reports the machine's address.
        *([f"--node-ip={node_ip}"] if node_ip else []),
        *extra_args,
    ]
    argv = _in_own_mount_namespace(folder, root, argv, fake_tunables=isolate_kernel_tunables)
    process = start_process("kubelet", argv, folder / "kubelet.log")
    try:
        yield process
    finally:
        process.stop()
        _unmount_below(root)
        shutil.rmtree(folder, ignore_errors=True)


# What the kubelet insists on (k8s.io/component-helpers/node/util/sysctl): it rewrites any that
# differ, or with protectKernelDefaults refuses to start.
KUBELET_KERNEL_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


# iptables front ends the kubelet would run to add KUBE-FIREWALL, KUBE-IPTABLES-HINT and canary
# chains to the machine's firewall; inside its namespace they are /bin/false, so it finds none.
IPTABLES_COMMANDS = (
    "iptables",
    "ip6tables",
    "iptables-legacy",
    "ip6tables-legacy",
    "iptables-nft",
    "ip6tables-nft",
)


def _in_own_mount_namespace(
    folder: Path, root: Path, argv: list[str], *, fake_tunables: bool
) -> list[str]:
    """Wrap `argv` so the kubelet runs in its own mount namespace, where it cannot change the
    machine: the iptables commands are /bin/false (no firewall chains), and with `fake_tunables`
    the kernel tunables it checks read as it wants them (files bound over /proc/sys).

    The root dir is first made a shared mount in this namespace, so volumes the kubelet mounts
    there are seen by the container runtime outside.
    """
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True)
    false = os.path.realpath(shutil.which("false") or "/bin/false")
    targets = {os.path.realpath(p) for p in map(shutil.which, IPTABLES_COMMANDS) if p}
    covers = {target: false for target in targets}
    if fake_tunables:
        for name, value in KUBELET_KERNEL_TUNABLES.items():
            fake = folder / ("sysctl-" + name.replace("/", "-"))
            fake.write_text(value + "\n")
            covers[f"/proc/sys/{name}"] = str(fake)
    steps = []
    for target, source in sorted(covers.items()):
        # The mount holding the target turns private first (only that mount, not the ones
        # below it): on a host whose / is shared the cover would otherwise reach the machine.
        steps.append(f'mount --make-private "$(findmnt -n -o TARGET -T {target})"')
        steps.append(f"mount --bind -o ro {source} {target}")
    script = " && ".join([*steps, 'exec "$@"'])
    return [
        "unshare",
        "--mount",
        "--propagation",
        "unchanged",
        "sh",
        "-c",
        script,
        "kubelet",
        *argv,
    ]


def _unmount_below(root: Path) -> None:
    """Lazily unmount what the kubelet mounted under `root` (volumes, pod folders), then
    `root` itself when it was bound onto itself."""
    prefix = str(root) + "/"
    with contextlib.suppress(OSError):
        lines = Path("/proc/self/mounts").read_text().splitlines()
        targets = [line.split()[1] for line in lines if line.split()[1].startswith(prefix)]
        for target in sorted(targets, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        if any(line.split()[1] == str(root) for line in lines):
            subprocess.run(["umount", "-l", str(root)], check=False, capture_output=True)


# --- container runtime -----------------------------------------------------------------------


@dataclass
class Containerd:
    """A private containerd (own root, state and socket) a kubelet can use as its CRI runtime."""

    process: Process
    folder: Path

    @property
    def socket(self) -> Path:
        return self.folder / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"


def _containerd_config(folder: Path, major: int) -> str:
    """The smallest config that keeps containerd off the machine's own paths and ports."""
    common = f"""
root = "{folder}/root"
state = "{folder}/state"
[grpc]
  address = "{folder}/containerd.sock"
[ttrpc]
  address = "{folder}/containerd.sock.ttrpc"
[debug]
  address = "{folder}/debug.sock"
[metrics]
  address = ""
"""
    if major >= 2:
        return f"""version = 3
{common}
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.internal.v1.opt']
  path = "{folder}/opt"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE (a container host) runc may not lower oom_score_adj to -998.
  restrict_oom_score_adj = true
"""
    return f"""version = 2
{common}
[plugins."io.containerd.internal.v1.opt"]
  path = "{folder}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
"""


@contextlib.contextmanager
def start_containerd(
    binary: Path | None = None,
    timeout_seconds: float = 60.0,
    configure: Callable[[Path], None] | None = None,
) -> Iterator[Containerd]:
    """Run containerd (the peers build, or `binary` such as /usr/bin/containerd) until the block
    ends; yields once its socket answers. `configure` may change its config file first."""
    path = binary or peer_binary("containerd")
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True)
    # "containerd github.com/containerd/containerd/v2 v2.3.4 <rev>" or "... 1.6.20~ds1 ..."
    words = version.stdout.split()
    major = int(words[2].lstrip("v").split(".")[0]) if len(words) > 2 else 2
    folder = Path(tempfile.mkdtemp(prefix="peerpods-containerd-"))
    config = folder / "config.toml"
    config.write_text(_containerd_config(folder, major))
    if configure is not None:
        configure(config)
    env_path = f"{path.parent}:{os.environ.get('PATH', '')}"  # its shims sit beside it
    with (folder / "containerd.log").open("wb") as log:
        popen = subprocess.Popen(
            [str(path), f"--config={config}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PATH": env_path},
        )
    runtime = Containerd(Process("containerd", popen, folder / "containerd.log"), folder)

    def answers() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(runtime.socket))
        return True

    try:
        wait_until("containerd socket", answers, timeout_seconds, runtime.process)
        yield runtime
    finally:
        runtime.process.stop()
        _kill_shims(folder)
        _unmount_below(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _kill_shims(folder: Path) -> None:
    """SIGKILL the shims this containerd started (their command line names its socket, which
    lives in `folder`) and the container processes under them; shims outlive containerd."""

    def parent_of(pid: str) -> str:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[1]

    pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    shims: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if str(folder).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                shims.add(pid)
    doomed = set(shims)
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            if parent_of(pid) in shims:
                doomed.add(pid)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    if doomed:
        time.sleep(0.5)
    # runc removes a container's cgroups only when it deletes the container; for those killed
    # here (cgroup path /<namespace>/<id>) they are removed now that they are empty.
    tasks = folder / "state" / "io.containerd.runtime.v2.task"
    for task in tasks.glob("*/*"):
        for hierarchy in Path("/sys/fs/cgroup").glob(f"**/{task.parent.name}/{task.name}"):
            with contextlib.suppress(OSError):
                hierarchy.rmdir()


# --- images without a registry ---------------------------------------------------------------

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.2"  # containerd 2.3's default sandbox image


def _with_libraries(paths: tuple[str, ...]) -> list[str]:
    """`paths` plus the shared libraries `ldd` says they load."""
    found = list(paths)
    for path in paths:
        listing = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
        for line in listing.stdout.splitlines():
            for word in line.split():
                if word.startswith("/") and word not in found:
                    found.append(word)
    return found


def host_files_image(archive: Path, name: str, paths: tuple[str, ...], command: list[str]) -> Path:
    """Write an OCI image archive named `name` whose one layer holds `paths` (host binaries and
    their libraries) and whose entrypoint is `command`: pods run without any registry."""
    import hashlib
    import io
    import tarfile

    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        files = _with_libraries(paths)
        folders = sorted({str(parent) for f in files for parent in Path(f.lstrip("/")).parents})
        for folder in folders:
            if folder != ".":
                entry = tarfile.TarInfo(folder)
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                layer.addfile(entry)
        for path in files:
            real = os.path.realpath(path)
            info = layer.gettarinfo(real, arcname=path.lstrip("/"))
            with open(real, "rb") as handle:
                layer.addfile(info, handle)
    layer_bytes = layer_buffer.getvalue()

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": command},
            "rootfs": {"type": "layers", "diff_ids": [digest(layer_bytes)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(layer_bytes),
                    "size": len(layer_bytes),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name,
                    },
                }
            ],
        }
    ).encode()
    with tarfile.open(archive, "w") as out:
        entries = {
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": index,
            **{f"blobs/sha256/{digest(b)[7:]}": b for b in (layer_bytes, config, manifest)},
        }
        for arcname, data in entries.items():
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return archive


def import_image(runtime: Containerd, archive: Path, ctr: Path | None = None) -> None:
    """Import an OCI archive into the CRI namespace (k8s.io) of `runtime`."""
    binary = ctr or peer_binary("ctr")
    subprocess.run(
        [str(binary), "-a", str(runtime.socket), "-n", "k8s.io", "images", "import", str(archive)],
        check=True,
        capture_output=True,
        timeout=120,
    )


def import_sleep_images(runtime: Containerd, ctr: Path | None = None) -> str:
    """Give `runtime` a sandbox image and a `peerpods.test/sleep:1` image built from the host's
    /bin/sleep; returns the latter's name. Both run `sleep infinity`."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    for name in (SANDBOX_IMAGE, "peerpods.test/sleep:1"):
        archive = runtime.folder / f"image-{name.replace('/', '_').replace(':', '_')}.tar"
        host_files_image(archive, name, (sleep,), [sleep, "infinity"])
        import_image(runtime, archive, ctr)
    return "peerpods.test/sleep:1"
