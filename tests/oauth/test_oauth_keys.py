"""Key URLs (data:, file:, plain paths) and public-key parsing (PEM, DER, certificates)."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from oauth import load_key_material, load_public_key, parse_public_key

RAW = b"\x00\x01secret-bytes\xff"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "url",
    [
        f"data:;base64,{b64(RAW)}",
        f"data:application/octet-stream;base64,{b64(RAW)}",
        f"data:text/plain;charset=utf-8;base64,{b64(RAW)}",
        f"data:;base64,{b64(RAW).rstrip('=')}",
    ],
)
def test_data_urls(url: str) -> None:
    assert load_key_material(url) == RAW


def test_file_urls_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "dir with space" / "k.bin"
    path.parent.mkdir()
    path.write_bytes(RAW)
    quoted = str(path).replace(" ", "%20")
    for url in (f"file://{path}", f"file:{path}", f"file://{quoted}", str(path)):
        assert load_key_material(url) == RAW
    assert load_key_material(f"file://localhost{path}") == RAW


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/key",
        "https://example.com/key",
        "env:TOKEN_KEY",
        "data:,plaintext",
        "data:text/plain,abc",
    ],
)
def test_unsupported_urls_name_the_value(url: str) -> None:
    with pytest.raises(ValueError) as info:
        load_key_material(url)
    assert url in str(info.value)


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty key URL"):
        load_key_material("")
    with pytest.raises(ValueError, match="invalid base64"):
        load_key_material("data:;base64,@@@")
    missing = tmp_path / "missing.key"
    with pytest.raises(ValueError, match="cannot read key") as info:
        load_key_material(f"file://{missing}")
    assert str(missing) in str(info.value)
    with pytest.raises(ValueError, match="local path"):
        load_key_material("file://otherhost/etc/key")
    with pytest.raises(ValueError, match="absolute"):
        load_key_material("file:relative/key")
    empty = tmp_path / "empty.key"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        load_key_material(str(empty))


def test_ec_public_key_pem_file(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path = tmp_path / "ec.pem"
    path.write_bytes(pem)
    loaded = load_public_key(f"file:{path}")
    assert isinstance(loaded, ec.EllipticCurvePublicKey)
    assert loaded.public_numbers() == key.public_key().public_numbers()


def test_public_key_from_certificate() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    loaded = parse_public_key(cert.public_bytes(serialization.Encoding.PEM))
    assert isinstance(loaded, rsa.RSAPublicKey)
    assert loaded.public_numbers() == key.public_key().public_numbers()


def test_unsupported_key_types_rejected() -> None:
    der = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ValueError, match="unsupported public key type"):
        parse_public_key(der)
    with pytest.raises(ValueError, match="invalid PEM"):
        parse_public_key(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ValueError, match="no PEM or DER"):
        parse_public_key(b"\x30\x03garbage")
