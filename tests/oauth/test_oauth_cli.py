"""The command line: ``edge-broker dev-issuer`` (ready line, stats, rotation by POST and
SIGHUP, clean stop) and ``edge-broker token`` (a token for scripts, the issuer's errors)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import jwt
import pytest

from tests.broker_process import REPO
from tests.oauth_helpers import credentials_url

CLI = [sys.executable, "-m", "edge.cli"]


def get(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, data=b"" if method == "POST" else None,
                                     method=method)
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def dev_issuer() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [*CLI, "dev-issuer", "--port", "0", "--client", "app:app-secret",
         "--client", "acme-app:acme-secret:acme", "--tenant-claim", "tenant",
         "--audience", "kafka", "--token-lifetime-seconds", "120"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("dev-issuer ready: http://127.0.0.1:"), line
    yield proc, line.split(": ", 1)[1].strip()
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def token_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "token", "--issuer-url", url, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=30)


def test_token_command_prints_a_token(dev_issuer: tuple[subprocess.Popen[str], str]) -> None:
    _proc, url = dev_issuer
    result = token_cli(url, "--credentials-url", credentials_url("acme-app", "acme-secret"),
                       "--audience", "kafka", "--scope", "kafka.write")
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(result.stdout.strip(), options={"verify_signature": False})
    assert claims["iss"] == url and claims["aud"] == "kafka" and claims["tenant"] == "acme"
    assert claims["scope"] == "kafka.write"
    assert claims["exp"] - claims["iat"] == 120


def test_token_command_json(dev_issuer: tuple[subprocess.Popen[str], str]) -> None:
    _proc, url = dev_issuer
    result = token_cli(url, "--json", "--auth-method", "client_secret_post",
                       "--credentials-url", credentials_url("app", "app-secret",
                                                            group_id="g1"))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["principal"] == "app"
    assert document["extensions"] == {"groupId": "g1"}
    assert document["expires_at"] == pytest.approx(time.time() + 120, abs=5)


@pytest.mark.parametrize(("credentials", "message"), [
    (credentials_url("app", "wrong"), "edge-broker token: invalid_client: bad secret"),
    ("data:application/json;base64,e30=", "'client_id' must be a non-empty string"),
])
def test_token_command_errors(dev_issuer: tuple[subprocess.Popen[str], str],
                              credentials: str, message: str) -> None:
    _proc, url = dev_issuer
    result = token_cli(url, "--credentials-url", credentials)
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stdout == ""


def test_stats_rotation_and_stop(dev_issuer: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = dev_issuer
    first = get(f"{url}/stats")
    assert len(first["kids"]) == 1
    get(f"{url}/jwks")
    assert get(f"{url}/stats")["jwks_requests"] == first["jwks_requests"] + 1
    rotated = get(f"{url}/rotate", "POST")["kid"]
    assert get(f"{url}/stats")["kids"] == [rotated, first["kids"][0]]
    proc.send_signal(signal.SIGHUP)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("dev-issuer rotated: kid "), line
    assert get(f"{url}/stats")["kids"][0] == line.split()[-1]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_dev_issuer_refuses_other_than_loopback() -> None:
    result = subprocess.run([*CLI, "dev-issuer", "--host", "0.0.0.0"], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "loopback only" in result.stderr


def test_help_lists_the_subcommands() -> None:
    result = subprocess.run([*CLI, "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0
    assert "token" in result.stdout and "dev-issuer" in result.stdout
    assert "--config" in result.stdout and "--set" in result.stdout
