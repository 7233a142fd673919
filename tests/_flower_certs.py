"""Certificates and node keys for Flower tests, made on the spot with the ``cryptography`` package.

- :func:`make_tls_files`: a throw-away CA and a SuperLink certificate for 127.0.0.1 / localhost signed by it,
  written as ``ca.crt``, ``server.pem`` and ``server.key`` (the files ``fedvlr-plus flower superlink
  --certificates DIR`` expects);
- :func:`make_node_key`: a SuperNode's EC P-384 key pair in OpenSSH format (Flower 1.42 reads the private key
  with ``load_ssh_private_key`` and registers the public key with ``flwr supernode register``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_tls_files(folder: Path) -> Path:
    """``ca.crt``, ``server.pem``, ``server.key`` in ``folder`` (valid for a day, SAN 127.0.0.1 and localhost)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fedvlr-test-ca"))
        .issuer_name(_name("fedvlr-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(_pem_key(key))
    return folder


def make_node_key(stem: Path) -> tuple[Path, Path]:
    """``stem`` (private key, OpenSSH) and ``stem.pub`` (public key, OpenSSH), as ``ssh-keygen -t ecdsa -b 384``."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    stem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    stem.chmod(0o600)
    pub = stem.with_name(stem.name + ".pub")
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return stem, pub
