"""The README's OAuth section: its Python examples run as printed (the issuer and broker
addresses swapped for the test's own), its properties snippet is valid, and its table of
``oauth.*`` keys is the one the code generates."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge.config import parse_properties
from oauth.dev_issuer import DevIssuer
from oauth.settings import parse_validator_settings, settings_reference_markdown
from tests.broker_process import REPO, BrokerProcess

README = (REPO / "README.md").read_text()
SECTION = README[README.index("## OAuth 2.0 (SASL/OAUTHBEARER)"):
                 README.index("## Topics and tenants")]
DOC_ISSUER = "http://127.0.0.1:8080"
DOC_BOOTSTRAP = "127.0.0.1:9096"


def example(name: str) -> str:
    match = re.search(rf"<!-- example:{name} -->\n```python\n(.*?)```", SECTION, re.S)
    assert match, f"README has no example {name!r} in the OAuth section"
    return match[1]


def run(name: str, broker: BrokerProcess, issuer: DevIssuer, cwd: Path) -> list[str]:
    code = example(name)
    assert DOC_ISSUER in code and DOC_BOOTSTRAP in code
    code = code.replace(DOC_ISSUER, issuer.url).replace(DOC_BOOTSTRAP, broker.bootstrap)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_oidc_example(broker: BrokerProcess, issuer: DevIssuer, tmp_path: Path) -> None:
    assert run("oauth-oidc", broker, issuer, tmp_path) == [f"hello {i}" for i in range(5)]


def test_confluent_callback_example(broker: BrokerProcess, issuer: DevIssuer,
                                    tmp_path: Path) -> None:
    assert run("oauth-confluent", broker, issuer, tmp_path) == ["undelivered: 0"]
    assert (broker.data_dir / "topics" / "acme" / "default" / "invoices").is_dir()
    broker.wait_for_log(r"principal acme-app, tenant acme, extensions \[groupId=billing, "
                        r"tenant=acme\]")


@pytest.mark.parametrize("name", ["oauth-kafka-python", "oauth-aiokafka"])
def test_provider_examples(broker: BrokerProcess, issuer: DevIssuer, tmp_path: Path,
                           name: str) -> None:
    assert run(name, broker, issuer, tmp_path) == ["offset 0"]


def test_properties_snippet_is_valid() -> None:
    match = re.search(r"cat > oauth\.properties <<'EOF'\n(.*?)EOF\n", SECTION, re.S)
    assert match
    settings = parse_validator_settings(parse_properties(match[1]))
    assert settings.issuer_url == DOC_ISSUER and settings.tenant_claim == "tenant"


def test_try_out_broker_runs_beside_make_runs() -> None:
    """The try-out broker serves where the examples connect, not on ``make run``'s port nor
    in its data directory."""
    match = re.search(r"(\.venv/bin/edge-broker --set .*?kopOauth2ConfigFile=\S+)", SECTION,
                      re.S)
    assert match, "README has no OAuth try-out broker"
    settings = dict(arg.split("=", 1) for arg in match[1].replace("\\\n", " ").split()
                    if "=" in arg)
    assert settings["kafkaListeners"] == f"SASL_PLAINTEXT://{DOC_BOOTSTRAP}"
    assert DOC_BOOTSTRAP != "127.0.0.1:9092"  # make run's
    assert settings["dataDir"] not in ("data", "./data")


def test_oauth_keys_table_matches_the_code() -> None:
    match = re.search(r"<!-- oauth-keys -->\n(.*?)<!-- /oauth-keys -->", SECTION, re.S)
    assert match is not None
    assert match[1].strip() == settings_reference_markdown().strip()


def test_admin_cli_example(broker: BrokerProcess, issuer: DevIssuer, tmp_path: Path) -> None:
    """The admin CLI's OAUTHBEARER properties file, as printed, logs in and works."""
    match = re.search(r"<!-- example:oauth-admin -->\n```sh\n(.*?)```", SECTION, re.S)
    assert match, "README has no example 'oauth-admin' in the OAuth section"
    script = match[1]
    assert DOC_ISSUER in script and DOC_BOOTSTRAP in script
    script = (script.replace(DOC_ISSUER, issuer.url).replace(DOC_BOOTSTRAP, broker.bootstrap)
              .replace(".venv/bin/edge-broker", f"{sys.executable} -m edge.cli"))
    result = subprocess.run(["bash", "-ec", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[:2] == [["NAME", "RESULT"], ["oauth-admin", "NONE"]]
    assert ["oauth-admin", "1", "false"] in lines[2:]
