"""``workbench.transport.certs.ensure_cert``: the self-signed pair every local TLS server uses
(sim, replay, test upstreams): made once, reused, renewed before it expires, made once when
several callers ask at the same time, the key owner-only."""

from __future__ import annotations

import datetime
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from workbench.transport.certs import CERT_NAME, KEY_NAME, CertPair, ensure_cert


def _cert(pair: CertPair) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pair.cert_path.read_bytes())


def _usable_for_tls(pair: CertPair) -> None:
    # load_cert_chain fails when the key does not belong to the certificate
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(pair.cert_path, pair.key_path)


def test_a_fresh_folder_gets_a_loopback_server_certificate(tmp_path: Path) -> None:
    pair = ensure_cert(tmp_path / "certs")
    assert pair == CertPair(tmp_path / "certs" / CERT_NAME, tmp_path / "certs" / KEY_NAME)
    _usable_for_tls(pair)
    assert stat.S_IMODE(pair.key_path.stat().st_mode) == 0o600
    cert = _cert(pair)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc - datetime.timedelta(days=365)


def test_an_existing_pair_is_reused(tmp_path: Path) -> None:
    first = ensure_cert(tmp_path)
    cert, key = first.cert_path.read_bytes(), first.key_path.read_bytes()
    assert ensure_cert(tmp_path) == first
    assert (first.cert_path.read_bytes(), first.key_path.read_bytes()) == (cert, key)


def _write_expiring(pair: CertPair, valid_for: datetime.timedelta) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=700))
            .not_valid_after(now + valid_for).sign(key, hashes.SHA256()))
    pair.cert_path.parent.mkdir(parents=True, exist_ok=True)
    pair.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))


@pytest.mark.parametrize(("valid_for", "renewed"), [(datetime.timedelta(hours=2), True),
                                                     (datetime.timedelta(days=-1), True),
                                                     (datetime.timedelta(days=3), False)])
def test_a_certificate_within_a_day_of_expiry_is_renewed(tmp_path: Path, valid_for: datetime.timedelta,
                                                         renewed: bool) -> None:
    pair = CertPair(tmp_path / CERT_NAME, tmp_path / KEY_NAME)
    _write_expiring(pair, valid_for)
    old = pair.cert_path.read_bytes()
    ensure_cert(tmp_path)
    assert (pair.cert_path.read_bytes() != old) is renewed
    _usable_for_tls(pair)


@pytest.mark.parametrize("damage", ["garbage certificate", "no key"])
def test_a_damaged_pair_is_made_again(tmp_path: Path, damage: str) -> None:
    pair = ensure_cert(tmp_path)
    if damage == "no key":
        pair.key_path.unlink()
    else:
        pair.cert_path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    ensure_cert(tmp_path)
    _usable_for_tls(pair)


def test_callers_at_the_same_time_get_one_pair(tmp_path: Path) -> None:
    # Each caller takes the lock through its own open file (as separate processes do); without
    # it one caller's key could land beside another caller's certificate.
    folder = tmp_path / "shared"
    got: list[tuple[bytes, bytes]] = []
    start = threading.Barrier(6)

    def caller() -> None:
        start.wait()
        pair = ensure_cert(folder)
        got.append((pair.cert_path.read_bytes(), pair.key_path.read_bytes()))

    threads = [threading.Thread(target=caller) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 6 and len(set(got)) == 1
    _usable_for_tls(CertPair(folder / CERT_NAME, folder / KEY_NAME))
    assert sorted(p.name for p in folder.iterdir()) == sorted([".lock", CERT_NAME, KEY_NAME])  # no temp file left


def test_without_a_folder_the_user_cache_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pair = ensure_cert()
    assert pair.cert_path == tmp_path / "cache" / "workbench" / "sim" / CERT_NAME
    _usable_for_tls(pair)
