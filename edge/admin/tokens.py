"""``admin tokens create|inspect``: the JWTs that PLAIN logins carry as ``token:<JWT>``
(as Pulsar's ``tokens create``), signed and checked by ``oauth`` (``token_signer``,
``key_validator``): no broker is contacted. ``create`` prints the token alone on its
last line."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

import jwt

from edge.admin.connection import Clients
from edge.admin.errors import UsageError
from edge.admin.output import Report
from edge.admin.parsing import SubParsers, duration_seconds, key_values
from oauth.errors import TokenInvalid
from oauth.key_validator import JwtTokenValidator, TokenSettings
from oauth.keys import load_private_key, load_secret_key
from oauth.login import unverified_claims
from oauth.token_signer import SigningKey, sign_token


def add_parsers(groups: SubParsers) -> None:
    """The ``tokens`` group and its verbs."""
    parser = groups.add_parser("tokens", help="create and inspect PLAIN login tokens")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser("create", help="sign a token; printed alone on the last line")
    key = create.add_mutually_exclusive_group(required=True)
    key.add_argument("--secret-key", metavar="URL",
                     help="the HMAC secret: file:/path (recommended: a data: URL on the "
                          "command line is visible to every user in ps and the shell "
                          "history), a path, or data:;base64,... (the broker's "
                          "tokenSecretKey)")
    key.add_argument("--private-key", metavar="URL",
                     help="RSA or EC private key, PEM or DER (pairs with tokenPublicKey)")
    create.add_argument("--subject", required=True, help="the role (principal)")
    create.add_argument("--expiry", default="1h",
                        help="lifetime: 30m, 1h, 7d ... (default 1h); 'never' for no exp")
    create.add_argument("--claim", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra claim (repeatable; a JSON value is taken as such)")
    create.add_argument("--subject-claim", default="sub",
                        help="claim holding the subject (the broker's tokenAuthClaim)")
    create.set_defaults(run=create_token)
    inspect = verbs.add_parser("inspect", help="show a token's header and claims; verify "
                                               "it with a key")
    inspect.add_argument("token", help="the token ('-' reads it from stdin; a 'token:' "
                                       "prefix is dropped)")
    check = inspect.add_mutually_exclusive_group()
    check.add_argument("--secret-key", metavar="URL", help="verify with this HMAC secret")
    check.add_argument("--public-key", metavar="URL", help="verify with this public key")
    inspect.set_defaults(run=inspect_token)


def _claim_value(text: str) -> object:
    try:
        value: object = json.loads(text)
    except ValueError:
        return text
    return value


def _time(seconds: object) -> str | None:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
    return None


def create_token(args: argparse.Namespace, clients: Clients) -> Report:
    """Sign a token for ``--subject``."""
    lifetime = None if args.expiry == "never" else duration_seconds(args.expiry, "--expiry")
    claims = {k: _claim_value(v) for k, v in key_values(args.claim, "--claim").items()}
    try:
        key: SigningKey = (load_secret_key(args.secret_key) if args.secret_key
                           else load_private_key(args.private_key))
        token = sign_token(key, args.subject, lifetime, claims,
                           subject_claim=args.subject_claim)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    expires = unverified_claims(token).get("exp")
    report = Report({"subject": args.subject, "algorithm": jwt.get_unverified_header(token)
                     ["alg"], "expires_at": _time(expires)})
    report.last = ("token", token)
    return report


def _read_token(text: str) -> str:
    token = (sys.stdin.read() if text == "-" else text).strip()
    return token.removeprefix("token:")


def inspect_token(args: argparse.Namespace, clients: Clients) -> Report:
    """The header and claims; with a key, whether the signature and times check out."""
    token = _read_token(args.token)
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise UsageError(f"not a JWT: {exc}") from None
    claims = unverified_claims(token)
    report = Report({"algorithm": str(header.get("alg")), "subject": _text(claims.get("sub")),
                     "issued_at": _time(claims.get("iat")),
                     "expires_at": _time(claims.get("exp")), "verified": None})
    if args.secret_key or args.public_key:
        try:
            validator = JwtTokenValidator(TokenSettings(secret_key=args.secret_key,
                                                        public_key=args.public_key))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            validator.validate(token)
            report.fields["verified"] = True
        except TokenInvalid as exc:
            report.fields["verified"] = False
            report.fields["reason"] = str(exc)
            report.failed = True
    table = report.table("claims", "claim", "value")
    for name in sorted(claims):
        value = claims[name]
        table.add(name, value if isinstance(value, str | int | float | bool) or value is None
                  else json.dumps(value))
    return report


def _text(value: object) -> str | None:
    return None if value is None else str(value)
