"""JwtTokenValidator: HMAC, RSA and EC tokens; expiry, nbf, audience, role claim, attacks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from oauth import JwtTokenValidator, TokenInvalid, TokenSettings
from sasl import TokenRejected

SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


def data_url(raw: bytes, mediatype: str = "") -> str:
    return f"data:{mediatype};base64,{base64.b64encode(raw).decode()}"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def hmac_validator() -> JwtTokenValidator:
    return JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET)))


@pytest.fixture
def rsa_validator(rsa_key: rsa.RSAPrivateKey) -> JwtTokenValidator:
    return JwtTokenValidator(TokenSettings(public_key=data_url(public_pem(rsa_key))))


@pytest.fixture
def ec_validator(ec_key: ec.EllipticCurvePrivateKey) -> JwtTokenValidator:
    return JwtTokenValidator(TokenSettings(public_key=data_url(public_pem(ec_key))))


def hs(claims: dict[str, Any], alg: str = "HS256", key: bytes = SECRET) -> str:
    return jwt.encode(claims, key, algorithm=alg)


def rejected(validator: JwtTokenValidator, token: str) -> str:
    with pytest.raises(TokenInvalid) as info:
        validator.validate(token)
    assert isinstance(info.value, TokenRejected)
    return info.value.message


# --- accepted tokens ---------------------------------------------------------------


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hmac_token_accepted(hmac_validator: JwtTokenValidator, alg: str) -> None:
    exp = int(time.time()) + 600
    result = hmac_validator.validate(hs({"sub": "alice", "exp": exp, "x": 1}, alg))
    assert result.principal == "alice"
    assert result.expires_at_ms == exp * 1000
    assert result.claims["x"] == 1


@pytest.mark.parametrize("alg", ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"])
def test_rsa_token_accepted(
    rsa_validator: JwtTokenValidator, rsa_key: rsa.RSAPrivateKey, alg: str
) -> None:
    token = jwt.encode({"sub": "bob"}, rsa_key, algorithm=alg)
    result = rsa_validator.validate(token)
    assert result.principal == "bob"
    assert result.expires_at_ms is None


def test_ec_token_accepted(
    ec_validator: JwtTokenValidator, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    assert ec_validator.algorithms == ("ES256",)
    token = jwt.encode({"sub": "carol", "exp": 2_000_000_000}, ec_key, algorithm="ES256")
    result = ec_validator.validate(token)
    assert result.principal == "carol"
    assert result.expires_at_ms == 2_000_000_000_000


def test_token_without_exp_is_allowed(hmac_validator: JwtTokenValidator) -> None:
    assert hmac_validator.validate(hs({"sub": "alice"})).expires_at_ms is None


def test_custom_auth_claim() -> None:
    validator = JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET), auth_claim="role"))
    assert validator.validate(hs({"sub": "x", "role": "admin"})).principal == "admin"
    assert rejected(validator, hs({"sub": "x"})) == "token has no 'role' claim"


# --- rejected tokens ---------------------------------------------------------------


def test_tampered_payload_rejected(hmac_validator: JwtTokenValidator) -> None:
    header, _, signature = hs({"sub": "alice"}).split(".")
    forged = b64url(json.dumps({"sub": "admin"}).encode())
    assert rejected(hmac_validator, f"{header}.{forged}.{signature}") == "token signature invalid"


def test_wrong_secret_rejected(hmac_validator: JwtTokenValidator) -> None:
    token = hs({"sub": "alice"}, key=b"another-secret-another-secret-another-secret!!")
    assert rejected(hmac_validator, token) == "token signature invalid"


def test_rsa_token_from_other_key_rejected(rsa_validator: JwtTokenValidator) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode({"sub": "bob"}, other, algorithm="RS256")
    assert rejected(rsa_validator, token) == "token signature invalid"


def test_ec_tampered_signature_rejected(
    ec_validator: JwtTokenValidator, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    header, payload, signature = jwt.encode({"sub": "carol"}, ec_key, algorithm="ES256").split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[5] ^= 0x01
    assert (
        rejected(ec_validator, f"{header}.{payload}.{b64url(bytes(raw))}")
        == "token signature invalid"
    )


def test_expired_token_rejected(hmac_validator: JwtTokenValidator) -> None:
    token = hs({"sub": "alice", "exp": int(time.time()) - 60})
    assert rejected(hmac_validator, token) == "token expired"


def test_leeway_accepts_recently_expired() -> None:
    validator = JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET), leeway_seconds=120))
    exp = int(time.time()) - 60
    assert validator.validate(hs({"sub": "alice", "exp": exp})).expires_at_ms == exp * 1000


def test_nbf_in_future_rejected(hmac_validator: JwtTokenValidator) -> None:
    token = hs({"sub": "alice", "nbf": int(time.time()) + 600})
    assert rejected(hmac_validator, token) == "token not valid yet"


def test_nbf_in_past_accepted(hmac_validator: JwtTokenValidator) -> None:
    token = hs({"sub": "alice", "nbf": int(time.time()) - 10})
    assert hmac_validator.validate(token).principal == "alice"


def test_non_numeric_exp_is_malformed(hmac_validator: JwtTokenValidator) -> None:
    assert rejected(hmac_validator, hs({"sub": "alice", "exp": "soon"})) == "malformed token"


def test_alg_none_rejected(hmac_validator: JwtTokenValidator) -> None:
    for alg in ("none", "None", "NONE"):
        header = b64url(json.dumps({"alg": alg, "typ": "JWT"}).encode())
        payload = b64url(json.dumps({"sub": "admin"}).encode())
        token = f"{header}.{payload}."
        assert rejected(hmac_validator, token) == "token algorithm 'none' not allowed"


def test_hmac_with_public_key_as_secret_rejected(
    rsa_validator: JwtTokenValidator, rsa_key: rsa.RSAPrivateKey
) -> None:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": "admin"}).encode())
    signing_input = f"{header}.{payload}".encode()
    mac = hmac.new(public_pem(rsa_key), signing_input, hashlib.sha256).digest()
    token = f"{header}.{payload}.{b64url(mac)}"
    assert rejected(rsa_validator, token) == "token algorithm 'HS256' not allowed"


def test_rsa_token_rejected_by_hmac_validator(
    hmac_validator: JwtTokenValidator, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode({"sub": "bob"}, rsa_key, algorithm="RS256")
    assert rejected(hmac_validator, token) == "token algorithm 'RS256' not allowed"


def test_ec_curve_fixes_the_algorithm(ec_validator: JwtTokenValidator) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    token = jwt.encode({"sub": "carol"}, p384, algorithm="ES384")
    assert rejected(ec_validator, token) == "token algorithm 'ES384' not allowed"


def test_rsa_alg_rejected_by_ec_validator(
    ec_validator: JwtTokenValidator, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode({"sub": "bob"}, rsa_key, algorithm="RS256")
    assert rejected(ec_validator, token) == "token algorithm 'RS256' not allowed"


def test_an_accepted_token_is_parsed_once(hmac_validator: JwtTokenValidator,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[object] = []
    parse = jwt.api_jws.PyJWS._load

    def counted(self: jwt.api_jws.PyJWS, token: str | bytes) -> Any:
        parses.append(token)
        return parse(self, token)

    monkeypatch.setattr(jwt.api_jws.PyJWS, "_load", counted)  # pyjwt's own parse, counted
    assert hmac_validator.validate(hs({"sub": "alice"})).principal == "alice"
    assert len(parses) == 1


def test_the_header_refusal_comes_first(hmac_validator: JwtTokenValidator) -> None:
    # pyjwt's decode refuses a b64 of false not listed in crit before it looks at the
    # algorithm (malformed); the algorithm's refusal is the one given, as when the header
    # was read first
    header = b64url(json.dumps({"alg": "RS256", "b64": False}).encode())
    token = f"{header}..{b64url(b'sig')}"
    assert rejected(hmac_validator, token) == "token algorithm 'RS256' not allowed"
    expired = hs({"sub": "alice", "exp": int(time.time()) - 600})
    assert rejected(hmac_validator, expired) == "token expired"


@pytest.mark.parametrize("claims", [{}, {"sub": ""}, {"sub": 42}, {"sub": None}])
def test_missing_or_bad_sub_rejected(
    hmac_validator: JwtTokenValidator, claims: dict[str, Any]
) -> None:
    assert rejected(hmac_validator, hs(claims)) == "token has no 'sub' claim"


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b.c", "a.b", "...."],
)
def test_malformed_token(hmac_validator: JwtTokenValidator, token: str) -> None:
    assert rejected(hmac_validator, token) == "malformed token"


@pytest.mark.parametrize("body", [b"[1, 2]", b"not json", b"\xff\xfe"])
def test_signed_payload_not_an_object_is_malformed(
    hmac_validator: JwtTokenValidator, body: bytes
) -> None:
    header = b64url(json.dumps({"alg": "HS256"}).encode())
    payload = b64url(body)
    mac = hmac.new(SECRET, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert rejected(hmac_validator, f"{header}.{payload}.{b64url(mac)}") == "malformed token"


# --- audience ------------------------------------------------------------------------


@pytest.fixture
def aud_validator() -> JwtTokenValidator:
    return JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET), audience="kafka"))


@pytest.mark.parametrize("aud", ["kafka", ["other", "kafka"]])
def test_audience_accepted(aud_validator: JwtTokenValidator, aud: object) -> None:
    assert aud_validator.validate(hs({"sub": "alice", "aud": aud})).principal == "alice"


@pytest.mark.parametrize("claims", [{"aud": "other"}, {"aud": ["a", "b"]}, {}, {"aud": 7}])
def test_audience_mismatch(aud_validator: JwtTokenValidator, claims: dict[str, Any]) -> None:
    token = hs({"sub": "alice", **claims})
    assert rejected(aud_validator, token) == "token audience mismatch"


def test_custom_audience_claim() -> None:
    validator = JwtTokenValidator(
        TokenSettings(secret_key=data_url(SECRET), audience="kafka", audience_claim="svc")
    )
    assert validator.validate(hs({"sub": "a", "svc": "kafka"})).principal == "a"
    assert rejected(validator, hs({"sub": "a", "aud": "kafka"})) == "token audience mismatch"


def test_aud_ignored_without_configured_audience(hmac_validator: JwtTokenValidator) -> None:
    assert hmac_validator.validate(hs({"sub": "alice", "aud": "any"})).principal == "alice"


# --- settings and keys --------------------------------------------------------------


def test_settings_need_exactly_one_key() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TokenSettings()
    with pytest.raises(ValueError, match="exactly one"):
        TokenSettings(secret_key="data:;base64,AA==", public_key="data:;base64,AA==")
    with pytest.raises(ValueError, match="leeway"):
        TokenSettings(secret_key="data:;base64,AA==", leeway_seconds=-1)


def test_secret_key_from_file_urls(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_bytes(SECRET)
    token = hs({"sub": "alice"})
    for url in (f"file://{path}", f"file:{path}", str(path)):
        validator = JwtTokenValidator(TokenSettings(secret_key=url))
        assert validator.validate(token).principal == "alice"


def test_public_key_der_file_and_base64(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    der = rsa_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    token = jwt.encode({"sub": "bob"}, rsa_key, algorithm="RS256")
    raw_file = tmp_path / "public.der"
    raw_file.write_bytes(der)
    b64_file = tmp_path / "public.b64"
    b64_file.write_bytes(base64.b64encode(der) + b"\n")
    for url in (
        f"file://{raw_file}",
        f"file:{b64_file}",
        data_url(der),
        data_url(der, "application/octet-stream"),
    ):
        validator = JwtTokenValidator(TokenSettings(public_key=url))
        assert validator.validate(token).principal == "bob"


def test_unusable_public_key_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="no PEM or DER public key"):
        JwtTokenValidator(TokenSettings(public_key=data_url(b"not a key")))


# --- exp required, maximum lifetime (tokenExpiration, tokenMaxLifetimeSeconds) ----------

def test_required_exp_refuses_a_token_without_it() -> None:
    validator = JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET), require_exp=True))
    assert rejected(validator, hs({"sub": "alice"})) == "token has no 'exp' claim"
    later = int(time.time()) + 60
    assert validator.validate(hs({"sub": "alice", "exp": later})).expires_at_ms == later * 1000


def test_the_refusal_of_a_token_without_exp_carries_the_hint() -> None:
    validator = JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET), require_exp=True,
                                                missing_exp_hint="key=X accepts it"))
    assert rejected(validator, hs({"sub": "alice"})) == \
        "token has no 'exp' claim (key=X accepts it)"


def test_maximum_lifetime_counts_from_iat_or_now() -> None:
    validator = JwtTokenValidator(TokenSettings(secret_key=data_url(SECRET),
                                                max_lifetime_seconds=600))
    now = int(time.time())
    assert "exceeds the maximum of 600 s" in rejected(validator, hs({"sub": "a",
                                                                    "exp": now + 3600}))
    assert "exceeds the maximum" in rejected(validator, hs({"sub": "a", "iat": now - 3000,
                                                           "exp": now + 60}))
    assert "'exp'" in rejected(validator, hs({"sub": "a"}))
    assert "malformed" in rejected(validator, hs({"sub": "a", "iat": "yesterday",
                                                 "exp": now + 60}))
    assert validator.validate(hs({"sub": "a", "iat": now - 60, "exp": now + 300})).principal \
        == "a"
