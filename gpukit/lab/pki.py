"""Certificates for the lab cluster, made the way a cluster installer makes them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CA:
    """A self-signed CA kept in `dir/ca.crt` and `dir/ca.key`."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"
        if not self.cert_path.exists():
            self._create()
        self.key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())

    def _create(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpukit-lab-ca")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + 10 * _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(self.key_path, _key_pem(key))
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: Path,
        common_name: str,
        organizations: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        """Write `stem.crt` and `stem.key` (0600) unless they exist; return both paths."""
        crt, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        if crt.exists() and key_path.exists():
            return crt, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        assert isinstance(self.key, ec.EllipticCurvePrivateKey)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        _write_private(key_path, _key_pem(key))
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt, key_path


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    priv, pub = directory / "sa.key", directory / "sa.pub"
    if not priv.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_private(priv, _key_pem(key))
        pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return priv, pub


def kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path, user: str) -> Path:
    """Write a kubeconfig with embedded file paths (0600: it grants access)."""
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: gpukit-lab
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: gpukit-lab
  context: {{cluster: gpukit-lab, user: {user}}}
current-context: gpukit-lab
"""
    _write_private(path, text.encode())
    return path
