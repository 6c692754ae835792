"""A self-signed loopback certificate for workbench's TLS servers, made on first use and reused.

The simulated backend and the replay server share it (its folder and file names say "sim" for
the first of them; clients already point at that path).

Clients trust it by pointing ``SSL_CERT_FILE`` (or httpx's ``verify=``) at ``cert_path``: the
certificate is its own trust anchor, so it is a leaf (CA:FALSE) with the key identifiers strict
verifiers ask for, valid for 127.0.0.1, ::1 and localhost.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CERT_NAME = "sim-cert.pem"
KEY_NAME = "sim-key.pem"
_VALID_DAYS = 730
_RENEW_BEFORE = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class CertPair:
    cert_path: Path
    key_path: Path


def default_cert_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "workbench" / "sim"


def ensure_cert(cert_dir: str | os.PathLike[str] | None = None) -> CertPair:
    """Return the cert/key pair in ``cert_dir``, creating it when missing or about to expire.

    Several test processes may start a simulator at once, so creation is serialised with a lock
    file and both files are written atomically.
    """
    directory = Path(cert_dir) if cert_dir is not None else default_cert_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        if cert_dir is not None:
            raise
        directory = Path(tempfile.gettempdir()) / f"workbench-sim-{os.getuid()}"
        directory.mkdir(parents=True, exist_ok=True)
    pair = CertPair(directory / CERT_NAME, directory / KEY_NAME)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _usable(pair):
                _generate(pair)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return pair


def _usable(pair: CertPair) -> bool:
    if not (pair.cert_path.exists() and pair.key_path.exists()):
        return False
    # cryptography loads only when a certificate is checked or made
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pair.cert_path.read_bytes())
    except (OSError, ValueError):
        return False
    now = datetime.datetime.now(datetime.UTC)
    return cert.not_valid_after_utc - _RENEW_BEFORE > now


def _generate(pair: CertPair) -> None:
    # cryptography loads only when a certificate is made
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "workbench sim (self-signed)")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_atomic(pair.key_path, key_pem, 0o600)
    _write_atomic(pair.cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
