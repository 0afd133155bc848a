"""The certificates and keys of a test control plane: one CA, the API server's serving certificate, a
client certificate per component (admin, controller manager, scheduler) and the service-account key
pair, written as PEM files into the control plane's data folder.

Every identity is what kubeadm gives the same component (the admin is in `system:masters`, the
controller manager is `system:kube-controller-manager`, ...), so RBAC treats them as on a real
cluster. Keys are EC P-256 (fast to make); the service-account key is RSA, which every token reviewer
accepts.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ClientIdentity", "Pki", "make_pki"]

_VALID = dt.timedelta(days=365)
SERVICE_IP = "10.0.0.1"  # the first address of the service range the API server is given


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate's files and who it says it is."""

    cert: Path
    key: Path
    user: str


@dataclass(frozen=True)
class Pki:
    """Paths of everything `make_pki` wrote."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_public: Path
    sa_private: Path
    admin: ClientIdentity
    controller_manager: ClientIdentity
    scheduler: ClientIdentity


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(parts)


def _sign(
    *,
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    ca_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    is_ca: bool = False,
    usage: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not is_ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    """Write a fresh CA and every certificate and key of the control plane into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpuyard-control-plane-ca")
    ca = _sign(subject=ca_name, public_key=ca_key.public_key(), ca_key=ca_key, issuer=ca_name, is_ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns.append("kubernetes.default.svc.cluster.local")
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1", SERVICE_IP)]
    serving = _sign(
        subject=_name("kube-apiserver"),
        public_key=serving_key.public_key(),
        ca_key=ca_key,
        issuer=ca_name,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )

    def client(stem: str, user: str, group: str | None = None) -> ClientIdentity:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(
            subject=_name(user, group),
            public_key=key.public_key(),
            ca_key=ca_key,
            issuer=ca_name,
            usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        return ClientIdentity(
            cert=_write_cert(folder / f"{stem}.crt", cert),
            key=_write_key(folder / f"{stem}.key", key),
            user=user,
        )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_public = folder / "sa.pub"
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca_cert=_write_cert(folder / "ca.crt", ca),
        ca_key=_write_key(folder / "ca.key", ca_key),
        serving_cert=_write_cert(folder / "apiserver.crt", serving),
        serving_key=_write_key(folder / "apiserver.key", serving_key),
        sa_public=sa_public,
        sa_private=_write_key(folder / "sa.key", sa_key),
        admin=client("admin", "kubernetes-admin", "system:masters"),
        controller_manager=client("controller-manager", "system:kube-controller-manager"),
        scheduler=client("scheduler", "system:kube-scheduler"),
    )
