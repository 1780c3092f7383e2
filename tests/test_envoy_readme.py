"""The "Behind Envoy" section of deploy/envoy/README.md works as printed: its shell
example writes the broker config, starts the broker, generates Envoy's bootstrap and
starts Envoy (ports swapped for free ones), and its client snippet produces and
consumes through Envoy."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from edge.config import parse_properties
from tests.broker_process import REPO, BrokerProcess
from tests.envoy_helpers import ENVOY, EnvoyProcess, validate
from tests.ports import free_ports

README = REPO / "deploy" / "envoy" / "README.md"


def _block(name: str, language: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- example:{name} -->\n```{language}\n(.*?)```", text, re.S)
    assert match, f"deploy/envoy/README.md has no {language} example {name!r}"
    return match[1]


def _commands(script: str) -> tuple[str, list[list[str]]]:
    """The heredoc's text and the other commands (continuations joined, split)."""
    heredoc = re.search(r"<<'EOF'\n(.*?)\nEOF\n", script, re.S)
    assert heredoc is not None
    rest = script[heredoc.end():].replace("\\\n", " ")
    return heredoc[1] + "\n", [shlex.split(line) for line in rest.splitlines() if line]


def _run_envoy_config(words: list[str], cwd: Path) -> None:
    assert words[:2] == [".venv/bin/edge-broker", "envoy-config"]
    result = subprocess.run([sys.executable, "-m", "edge.cli", *words[1:]], cwd=cwd,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_readme_example_as_printed_is_a_valid_bootstrap(tmp_path: Path) -> None:
    properties, commands = _commands(_block("envoy-sh", "sh"))
    (tmp_path / "broker.properties").write_text(properties)
    _run_envoy_config(commands[1], tmp_path)
    result = validate(tmp_path / "envoy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_example_runs_end_to_end(tmp_path: Path) -> None:
    internal, envoy_port, admin = free_ports(3)
    ports = {"29092": str(internal), "19092": str(envoy_port), "9901": str(admin)}

    def localize(text: str) -> str:
        return re.sub(r"\b(29092|19092|9901)\b", lambda m: ports[m[1]], text)

    properties, commands = _commands(localize(_block("envoy-sh", "sh")))
    (tmp_path / "broker.properties").write_text(properties)
    broker_cmd, config_cmd, envoy_cmd = commands
    assert broker_cmd == [".venv/bin/edge-broker", "--config", "broker.properties", "&"]
    assert envoy_cmd == [".venv/bin/envoy", "-c", "envoy.yaml", "--disable-hot-restart"]
    assert Path(envoy_cmd[0]).name == ENVOY.name
    settings = parse_properties(properties)
    settings["dataDir"] = str(tmp_path / settings["dataDir"])
    broker = BrokerProcess(tmp_path, settings)
    envoy = EnvoyProcess(tmp_path / "envoy.yaml", admin)
    try:
        broker.start()
        _run_envoy_config(config_cmd, tmp_path)
        envoy.start()
        client = subprocess.run([sys.executable, "-c", localize(_block("envoy-client",
                                                                       "python"))],
                                cwd=tmp_path, capture_output=True, text=True, timeout=120,
                                check=False)
        assert client.returncode == 0, client.stderr
        assert client.stdout.splitlines() == ["hello via Envoy"]
        stats = envoy.stats()
        assert stats["tcp.kafka_broker_0.downstream_cx_total"] >= 2
        envoy.wait_for(lambda: any("upstream=kafka-broker-0/" in line for line in envoy.lines),
                       10, "an access log line")
    finally:
        envoy.stop()
        if broker.alive():
            broker.stop()
