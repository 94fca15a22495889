"""The few Kubernetes API calls peerpods makes, over urllib3, with the cluster's credentials.

The node advertiser reads its Node and patches its status; the webhook reads DRA objects. Both
find the cluster the way kubectl and client-go do: in a pod, the service account (the token file
re-read whenever the kubelet rotates it, the cluster CA, KUBERNETES_SERVICE_HOST/PORT); else the
kubeconfig that KUBECONFIG names (a list merged, the first file to set a name wins) or
~/.kube/config, at its current context. Calls block: callers run them in threads, and one client
is safe to share between threads (urllib3's connection pool).

    KubeError                 the Kubernetes API could not be used
    ├── KubeConfigError       no usable configuration (says where it looked and what is wrong)
    └── KubeApiError          a call failed: `status` is the HTTP status, None when none came
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import ssl
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import urllib3
import yaml

from providers.clouds.kube_transport import (
    AnswerEncoded,
    AnswerTooLarge,
    deadline,
    pool,
    read_bounded,
)
from providers.core.errors import Fault, PeerpodsError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
JSON_PATCH = "application/json-patch+json"
# The most one answer may hold: a list of every Node of a 5,000-node cluster fits with room.
MAX_ANSWER_BYTES = 64 << 20
# A kubeconfig is a few KiB; one far larger is not one (and is never parsed whole).
MAX_KUBECONFIG_BYTES = 4 << 20


class KubeError(PeerpodsError):
    """The Kubernetes API could not be used."""

    fault = Fault.UNAVAILABLE


class KubeConfigError(KubeError):
    """Neither the in-cluster configuration nor a kubeconfig is usable."""


class KubeApiError(KubeError):
    """A call reached no answer, or an answer other than 2xx; `status` is None without one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Token:
    """A bearer token, fixed or read from a file and read again whenever the file changes (the
    kubelet replaces a projected service-account token before it expires)."""

    def __init__(self, value: str | None = None, path: Path | None = None) -> None:
        if (value is None) == (path is None):
            raise ValueError("a token is a value or a file, exactly one")
        self._value = value
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        if self.path is None:
            return self._value or ""
        try:
            stat = self.path.stat()
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            with self._lock:
                if seen != self._seen or self._value is None:
                    self._value = self.path.read_text().strip()
                    self._seen = seen
                return self._value
        except OSError as exc:
            raise KubeApiError(f"reading the token file {self.path}: {exc.strerror}") from None


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate to it."""

    server: str  # scheme://host[:port], no trailing slash
    source: str  # where it came from, for messages: "in-cluster" or "kubeconfig PATH, context C"
    ssl_context: ssl.SSLContext | None = None  # None: plain http (a local test server)
    token: Token | None = None
    tls_server_name: str | None = None  # the name the server's certificate must carry
    insecure: bool = False  # insecure-skip-tls-verify


def load_config(
    environ: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT
) -> KubeConfig:
    """In-cluster when this runs in a pod with a service account, else the kubeconfig."""
    env = os.environ if environ is None else environ
    try:
        return in_cluster_config(env, service_account)
    except KubeConfigError as in_cluster:
        try:
            return kubeconfig_config(env)
        except KubeConfigError as kubeconfig:
            raise KubeConfigError(f"{kubeconfig} (and not in a cluster: {in_cluster})") from None


def in_cluster_config(
    environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> KubeConfig:
    """The pod's service account: the API server from the environment the kubelet sets."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token_file, ca_file = service_account / "token", service_account / "ca.crt"
    for path in (token_file, ca_file):
        if not path.is_file():
            raise KubeConfigError(f"no service-account file {path}")
    try:
        Token(path=token_file).current()  # readable now, or a configuration error now
    except KubeApiError as exc:
        raise KubeConfigError(str(exc)) from None
    context = _tls_context(f"the service account's {ca_file}", ca_file=ca_file)
    return KubeConfig(
        server=f"https://{_host(host)}:{port}",
        source="in-cluster",
        ssl_context=context,
        token=Token(path=token_file),
    )


def kubeconfig_config(environ: Mapping[str, str], context_name: str | None = None) -> KubeConfig:
    """The kubeconfig's current (or the named) context: its cluster and its user."""
    files = _kubeconfig_files(environ)
    merged = _merge(files)
    name = context_name or merged["current-context"]
    where = f"kubeconfig {os.pathsep.join(str(f) for f in files)}"
    if not name:
        raise KubeConfigError(f"{where} sets no current-context")
    context = _entry(merged, "contexts", name, where)
    cluster = _entry(merged, "clusters", str(context.get("cluster", "")), where)
    user_name = context.get("user")
    user = _entry(merged, "users", str(user_name), where) if user_name else {}
    source = f"{where}, context {name}"
    return _from_entries(cluster, user, source)


def _kubeconfig_files(environ: Mapping[str, str]) -> list[Path]:
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not listed:
        home = environ.get("HOME")
        default = Path(home) / ".kube" / "config" if home else DEFAULT_KUBECONFIG.expanduser()
        if not default.is_file():
            raise KubeConfigError(f"KUBECONFIG is not set and there is no {default}")
        return [default]
    found = [Path(p) for p in listed if Path(p).is_file()]  # kubectl skips missing files
    if not found:
        raise KubeConfigError(f"no kubeconfig file at KUBECONFIG={environ['KUBECONFIG']}")
    return found


def _merge(files: list[Path]) -> dict[str, Any]:
    """The kubeconfigs as one: each named cluster, user and context from the first file naming
    it (with the file it came from: relative paths are relative to that file), the first
    current-context set."""
    merged: dict[str, Any] = {
        "current-context": "", "clusters": {}, "users": {}, "contexts": {}, "origins": {},
    }  # fmt: skip
    for path in files:
        loaded = _load_yaml(path)
        if loaded is None:
            continue
        if not isinstance(loaded, dict):
            raise KubeConfigError(f"kubeconfig {path} is not a mapping")
        if not merged["current-context"] and loaded.get("current-context"):
            merged["current-context"] = str(loaded["current-context"])
        for section, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for item in loaded.get(section) or []:
                if not isinstance(item, dict) or "name" not in item:
                    raise KubeConfigError(f"kubeconfig {path}: an entry of {section} has no name")
                key = str(item["name"])
                if key not in merged[section]:
                    body = item.get(inner) or {}
                    if not isinstance(body, dict):
                        raise KubeConfigError(f"kubeconfig {path}: {section} {key} is malformed")
                    merged[section][key] = body
                    merged["origins"][(section, key)] = path.parent
    return merged


def _load_yaml(path: Path) -> Any:
    """One kubeconfig file parsed, or KubeConfigError saying why, never quoting its text (it
    holds credentials)."""
    try:
        with path.open("rb") as source:
            text = source.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as exc:
        raise KubeConfigError(f"reading kubeconfig {path}: {exc.strerror or exc}") from None
    if len(text) > MAX_KUBECONFIG_BYTES:
        raise KubeConfigError(f"kubeconfig {path} is larger than {MAX_KUBECONFIG_BYTES} bytes")
    try:
        return yaml.safe_load(text.decode())
    except UnicodeDecodeError:
        raise KubeConfigError(f"kubeconfig {path} is not UTF-8 text") from None
    except RecursionError:
        raise KubeConfigError(f"kubeconfig {path} is nested too deeply to be one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise KubeConfigError(f"kubeconfig {path}: {problem}{where}") from None


def _entry(merged: dict[str, Any], section: str, name: str, where: str) -> dict[str, Any]:
    entry = merged[section].get(name)
    if entry is None:
        raise KubeConfigError(f"{where} has no {section[:-1]} named {name!r}")
    return {**entry, "_base": merged["origins"][(section, name)]}


def _from_entries(cluster: dict[str, Any], user: dict[str, Any], source: str) -> KubeConfig:
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        shown = redact(server)
        raise KubeConfigError(f"{source}: the cluster's server {shown!r} is not an http(s) URL")
    if "@" in urlsplit(server).netloc:
        raise KubeConfigError(
            f"{source}: the cluster's server {redact(server)} carries credentials in its URL, "
            "which are not supported; use a token, a token file or a client certificate"
        )
    for unsupported in ("exec", "auth-provider", "username", "password"):
        if user.get(unsupported):
            raise KubeConfigError(
                f"{source}: the user's {unsupported} is not supported; use a token, a token "
                "file or a client certificate"
            )
    token: Token | None = None
    if user.get("token"):
        token = Token(value=str(user["token"]))
    elif user.get("tokenFile"):
        token = Token(path=_path(user, "tokenFile"))
    insecure = _insecure(cluster, source)
    context = None
    if server.startswith("https://"):
        context = _tls_context(
            f"{source}: the cluster's certificate authority",
            ca_file=_path(cluster, "certificate-authority"),
            ca_data=_data(cluster, "certificate-authority-data", source),
            insecure=insecure,
        )
        cert = _data(user, "client-certificate-data", source)
        key = _data(user, "client-key-data", source)
        cert_file, key_file = _path(user, "client-certificate"), _path(user, "client-key")
        if (cert or cert_file) or (key or key_file):
            _load_client_certificate(context, source, cert, cert_file, key, key_file)
    elif user.get("client-certificate") or user.get("client-certificate-data"):
        raise KubeConfigError(f"{source}: a client certificate needs an https server")
    name = cluster.get("tls-server-name")
    return KubeConfig(
        server=server,
        source=source,
        ssl_context=context,
        token=token,
        tls_server_name=str(name) if name else None,
        insecure=insecure,
    )


def _insecure(cluster: dict[str, Any], source: str) -> bool:
    """insecure-skip-tls-verify: a YAML boolean only (the string "false" is not false), and
    never together with a certificate authority (kubectl refuses that too)."""
    value = cluster.get("insecure-skip-tls-verify", False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise KubeConfigError(
            f"{source}: the cluster's insecure-skip-tls-verify must be true or false (a YAML "
            f"boolean, unquoted), not {type(value).__name__} {str(value)[:20]!r}"
        )
    if value and (
        cluster.get("certificate-authority") or cluster.get("certificate-authority-data")
    ):
        raise KubeConfigError(
            f"{source}: specifying a root certificates file with the insecure flag is not "
            "allowed (insecure-skip-tls-verify with a certificate authority)"
        )
    return value


def redact(url: str) -> str:
    """`url` with any user and password in it replaced by "***" (for messages and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def _path(entry: dict[str, Any], key: str) -> Path | None:
    value = entry.get(key)
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else Path(entry["_base"]) / path


def _data(entry: dict[str, Any], key: str, source: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KubeConfigError(f"{source}: {key} is not base64") from None


def _tls_context(
    what: str,
    ca_file: Path | None = None,
    ca_data: bytes | None = None,
    insecure: bool = False,
) -> ssl.SSLContext:
    """Verify against the given authority only (the system's when none is given)."""
    try:
        if ca_data is not None:
            context = ssl.create_default_context(cadata=ca_data.decode("ascii"))
        elif ca_file is not None:
            context = ssl.create_default_context(cafile=str(ca_file))
        else:
            context = ssl.create_default_context()
    except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise KubeConfigError(f"{what} is not usable: {_reason(exc)}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _load_client_certificate(
    context: ssl.SSLContext,
    source: str,
    cert: bytes | None,
    cert_file: Path | None,
    key: bytes | None,
    key_file: Path | None,
) -> None:
    if (cert is None and cert_file is None) or (key is None and key_file is None):
        raise KubeConfigError(f"{source}: a client certificate needs both its certificate and key")
    with tempfile.TemporaryDirectory(prefix="peerpods-kube-") as scratch:
        # ssl loads a certificate chain from files only: the data's copies live for this call
        if cert is not None:
            cert_file = _private_file(Path(scratch) / "cert.pem", cert)
        if key is not None:
            key_file = _private_file(Path(scratch) / "key.pem", key)
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(
                f"{source}: the client certificate and key are not usable: {_reason(exc)}"
            ) from None


def _private_file(path: Path, data: bytes) -> Path:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    return path


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc)


def _host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def path_segment(name: str) -> str:
    """A name put into a request path (names never hold '/', but never trust that)."""
    return quote(name, safe="")


class KubeClient:
    """GET and PATCH on the API server of one KubeConfig, answers as JSON objects."""

    def __init__(
        self,
        config: KubeConfig,
        timeout_seconds: float = 10.0,
        connections: int = 16,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        # `connections` kept open for reuse: as many as threads that call at once (the webhook
        # looks up from up to 16); one more is opened when needed, and closed after its call.
        # `timeout_seconds` bounds each call whole; `max_answer_bytes` what one answer may hold.
        self.config = config
        self.timeout_seconds = timeout_seconds
        self.max_answer_bytes = max_answer_bytes
        self._where = redact(config.server)  # what messages name
        tls: dict[str, Any] = {}
        if config.ssl_context is not None:
            tls = {
                "ssl_context": config.ssl_context,
                "cert_reqs": "CERT_NONE" if config.insecure else "CERT_REQUIRED",
            }
            if config.insecure:
                tls["assert_hostname"] = False
            if config.tls_server_name:
                tls["server_hostname"] = config.tls_server_name
        self._pool = pool(num_pools=1, maxsize=connections, block=False, retries=False, **tls)

    def get(self, path: str, *, timeout_seconds: float | None = None) -> dict[str, Any]:
        return self.request("GET", path, timeout_seconds=timeout_seconds)

    def patch(
        self,
        path: str,
        body: Any,
        content_type: str = JSON_PATCH,
        *,
        timeout_seconds: float | None = None,
    ) -> dict[str, Any]:
        return self.request(
            "PATCH", path, body, content_type=content_type, timeout_seconds=timeout_seconds
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout_seconds: float | None = None,
    ) -> dict[str, Any]:
        """One call, over within the timeout however the server answers; the answer's JSON
        object, or KubeApiError."""
        headers = {"Accept": "application/json", "User-Agent": "peerpods"}
        if self.config.token is not None:
            headers["Authorization"] = f"Bearer {self.config.token.current()}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        with deadline(timeout) as limit:
            try:
                status, reason, payload = self._exchange(method, path, data, headers, timeout)
            except (urllib3.exceptions.HTTPError, OSError, HTTPException) as exc:
                if limit.expired:
                    raise KubeApiError(f"{self._where}: no answer within {timeout:g}s") from None
                raise KubeApiError(f"{self._where}: {_reason(exc)}") from None
            except AnswerTooLarge as exc:
                raise KubeApiError(
                    f"{self._where}: the answer is larger than the client reads "
                    f"(at most {self.max_answer_bytes} bytes{exc})"
                ) from None
            except AnswerEncoded as exc:
                raise KubeApiError(
                    f"{self._where}: the answer is compressed ({exc}), which was not asked for"
                ) from None
            if limit.expired:  # what came before the socket was shut down may be cut short
                raise KubeApiError(f"{self._where}: no answer within {timeout:g}s")
        if not 200 <= status < 300:
            said = _message(payload) or reason or ""
            raise KubeApiError(f"HTTP {status} {said}".rstrip(), status)
        try:
            answer = json.loads(payload)
        except (ValueError, RecursionError):
            raise KubeApiError("the answer is not JSON", status) from None
        if not isinstance(answer, dict):
            raise KubeApiError("the answer is not a JSON object", status)
        return answer

    def _exchange(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, str, bytes]:
        """Status, reason and the bounded body; the connection goes back to the pool only when
        the body was read whole."""
        response = self._pool.request(
            method,
            self.config.server + path,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
            redirect=False,
            preload_content=False,
            decode_content=False,
        )
        whole = False
        try:
            payload = read_bounded(response, self.max_answer_bytes)
            whole = True
        finally:
            if not whole:
                response.close()
            response.release_conn()
        return response.status, response.reason or "", payload

    def close(self) -> None:
        self._pool.clear()


def _message(data: bytes) -> str:
    """A Status answer's reason and message (what the API server says went wrong)."""
    try:
        status = json.loads(data)
    except ValueError:
        return ""
    if not isinstance(status, dict):
        return ""
    parts = [str(status[k]) for k in ("reason", "message") if status.get(k)]
    return ": ".join(parts)[:300]
