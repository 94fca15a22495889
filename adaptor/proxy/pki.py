"""The adaptor's own certificate authority for mTLS to pod VM forwarders.

Each pod VM gets a server certificate issued here (delivered in its user data) that names its
sandbox (`sandbox_uri`, a URI SAN); the adaptor dials with a client certificate issued here, and
the forwarder accepts only clients chained to this CA. On connect the adaptor checks that the
server's certificate names the sandbox it dialed for (`check_sandbox`): a certificate issued to
one VM (possibly running a tenant-chosen image) is never accepted for another.
The CA lives under `--state-dir/pki` so a restarted adaptor still trusts, and is trusted by, the
VMs it created before. Keys are P-256 (small user data, fast issuance); files are written
atomically with mode 0600 for keys.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from providers.core.errors import InvalidRequest

CA_DAYS = 3650
LEAF_DAYS = 825
SERVER_NAME = "podvm-server"
CLIENT_NAME = "peerpods-adaptor"


SANDBOX_URI_PREFIX = "urn:peerpods:sandbox:"


class WrongSandbox(InvalidRequest):
    """The pod VM presented a certificate issued for another sandbox (or for none)."""


def sandbox_uri(sandbox_id: str) -> str:
    """The URI SAN that binds a server certificate to one sandbox."""
    return SANDBOX_URI_PREFIX + sandbox_id


def certificate_sandboxes(der: bytes) -> list[str]:
    """The sandbox ids a DER certificate is issued for (its peerpods URI SANs)."""
    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    return [u[len(SANDBOX_URI_PREFIX) :] for u in uris if u.startswith(SANDBOX_URI_PREFIX)]


def check_sandbox(der: bytes | None, sandbox_id: str) -> None:
    """WrongSandbox unless the (already chain-verified) certificate names `sandbox_id`."""
    if der is None:
        raise WrongSandbox("the pod VM presented no certificate")
    try:
        names = certificate_sandboxes(der)
    except ValueError as exc:
        raise WrongSandbox(f"the pod VM's certificate cannot be read: {exc}") from None
    if sandbox_id not in names:
        issued = ", ".join(names) or "no sandbox"
        raise WrongSandbox(
            f"the pod VM's certificate is issued for {issued}, not for sandbox {sandbox_id}"
        )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically: a crash never leaves half a key."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class IssuedPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: str
    key_pem: str


class AdaptorPKI:
    """The CA plus the adaptor's client certificate, loaded from or created under `directory`."""

    def __init__(
        self, directory: Path, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
    ) -> None:
        self.directory = directory
        self.ca_cert = ca_cert
        self._ca_key = ca_key

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def client_cert_file(self) -> Path:
        return self.directory / "client.crt"

    @property
    def client_key_file(self) -> Path:
        return self.directory / "client.key"

    @property
    def ca_pem(self) -> str:
        return _cert_pem(self.ca_cert).decode()

    @classmethod
    def load_or_create(cls, state_dir: str | os.PathLike[str]) -> AdaptorPKI:
        """The CA under `state_dir/pki`: reused when present, created (once) when not.

        Blocking file IO: call it at start-up or through asyncio.to_thread.
        """
        directory = Path(state_dir) / "pki"
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            ca_file, key_file = directory / "ca.crt", directory / "ca.key"
            if ca_file.exists() and key_file.exists():
                pki = cls._load(directory, ca_file.read_bytes(), key_file.read_bytes())
            else:
                pki = cls._create(directory)
            if not (pki.client_cert_file.exists() and pki.client_key_file.exists()):
                pair = pki._issue(CLIENT_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, dns=())
                _write(pki.client_key_file, pair.key_pem.encode(), 0o600)
                _write(pki.client_cert_file, pair.cert_pem.encode(), 0o644)
        except OSError as exc:
            raise InvalidRequest(f"state dir {directory}: {exc.strerror or exc}") from exc
        return pki

    @classmethod
    def _load(cls, directory: Path, cert: bytes, key: bytes) -> AdaptorPKI:
        try:
            ca_cert = x509.load_pem_x509_certificate(cert)
            ca_key = serialization.load_pem_private_key(key, password=None)
        except ValueError as exc:
            raise InvalidRequest(f"{directory}: unreadable CA files: {exc}") from exc
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise InvalidRequest(f"{directory}/ca.key: expected an EC private key")
        cert_key = ca_cert.public_key()
        if (
            not isinstance(cert_key, ec.EllipticCurvePublicKey)
            or ca_key.public_key().public_numbers() != cert_key.public_numbers()
        ):
            raise InvalidRequest(f"{directory}: ca.key does not match ca.crt")
        return cls(directory, ca_cert, ca_key)

    @classmethod
    def _create(cls, directory: Path) -> AdaptorPKI:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peerpods adaptor CA")])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write(directory / "ca.key", _key_pem(key), 0o600)
        _write(directory / "ca.crt", _cert_pem(cert), 0o644)
        return cls(directory, cert, key)

    def _issue(
        self,
        common_name: str,
        usage: x509.ObjectIdentifier,
        dns: tuple[str, ...],
        ips: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
    ) -> IssuedPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        names += [x509.UniformResourceIdentifier(u) for u in uris]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return IssuedPair(_cert_pem(cert).decode(), _key_pem(key).decode())

    def issue_server(self, sandbox_id: str, ips: tuple[str, ...] = ()) -> IssuedPair:
        """A forwarder server certificate for one pod VM: SAN podvm-server (CAA's name), the
        sandbox's URI (checked on connect) and any known IPs."""
        name = f"podvm-{sandbox_id[:16]}"
        return self._issue(
            name, ExtendedKeyUsageOID.SERVER_AUTH, (SERVER_NAME,), ips, (sandbox_uri(sandbox_id),)
        )
