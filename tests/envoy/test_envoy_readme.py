"""The "Behind Envoy" section of deploy/envoy/README.md works as printed: its shell
example writes the broker config, starts the broker, generates Envoy's bootstrap and
starts Envoy (ports swapped for free ones), and its client snippet produces and
consumes through Envoy; the xDS example does the same with the brokers file it shows;
the registry example starts two brokers on one database (a test database swapped in) and
an xds-server on its registry, and its client snippet lists both brokers through Envoy."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from edge.config import parse_properties
from tests.broker_process import REPO, BrokerProcess
from tests.envoy_helpers import ENVOY, EnvoyProcess, XdsProcess, validate
from tests.ports import free_ports
from tests.postgres_server import shared_server

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


def _localizer(fixed: tuple[str, ...] = ("29092", "19092", "9901", "18000", "18001")
               ) -> tuple[dict[str, int], Callable[[str], str]]:
    """Free ports for the README's fixed ones, and a function swapping them in a text."""
    ports = dict(zip(fixed, free_ports(len(fixed)), strict=True))

    def localize(text: str) -> str:
        return re.sub(rf"\b({'|'.join(fixed)})\b", lambda m: str(ports[m[1]]), text)

    return ports, localize


def _client_through_envoy(localize: Callable[[str], str], cwd: Path) -> None:
    client = subprocess.run([sys.executable, "-c", localize(_block("envoy-client", "python"))],
                            cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert client.returncode == 0, client.stderr
    assert client.stdout.splitlines() == ["hello via Envoy"]


def _example_broker(localize: Callable[[str], str], cwd: Path) -> BrokerProcess:
    """The broker of the first example, from its properties."""
    settings = parse_properties(_commands(localize(_block("envoy-sh", "sh")))[0])
    settings["dataDir"] = str(cwd / settings["dataDir"])
    return BrokerProcess(cwd, settings)


def test_readme_example_runs_end_to_end(tmp_path: Path) -> None:
    ports, localize = _localizer()
    admin = ports["9901"]

    properties, commands = _commands(localize(_block("envoy-sh", "sh")))
    (tmp_path / "broker.properties").write_text(properties)
    broker_cmd, config_cmd, envoy_cmd = commands
    assert broker_cmd == [".venv/bin/edge-broker", "--config", "broker.properties", "&"]
    assert envoy_cmd == [".venv/bin/envoy", "-c", "envoy.yaml", "--disable-hot-restart"]
    assert Path(envoy_cmd[0]).name == ENVOY.name
    broker = _example_broker(localize, tmp_path)
    envoy = EnvoyProcess(tmp_path / "envoy.yaml", admin)
    try:
        broker.start()
        _run_envoy_config(config_cmd, tmp_path)
        envoy.start()
        _client_through_envoy(localize, tmp_path)
        stats = envoy.stats()
        assert stats["tcp.kafka_broker_0.downstream_cx_total"] >= 2
        envoy.wait_for(lambda: any("upstream=kafka-broker-0/" in line for line in envoy.lines),
                       10, "an access log line")
    finally:
        envoy.stop()
        if broker.alive():
            broker.stop()


def test_readme_proxy_protocol_example_runs_end_to_end(tmp_path: Path) -> None:
    """The PROXY protocol example as printed (ports swapped): the client snippet works
    through Envoy, whose every connection the broker took with its header (that the broker
    then sees the client's address is tests/envoy/test_envoy_proxy_protocol.py)."""
    ports, localize = _localizer()
    properties, commands = _commands(localize(_block("envoy-proxy-protocol-sh", "sh")))
    (tmp_path / "broker.properties").write_text(properties)
    broker_cmd, config_cmd, envoy_cmd = commands
    assert broker_cmd == [".venv/bin/edge-broker", "--config", "broker.properties", "&"]
    assert "--proxy-protocol" in config_cmd
    assert envoy_cmd == [".venv/bin/envoy", "-c", "envoy.yaml", "--disable-hot-restart"]
    settings = parse_properties(properties)
    settings["dataDir"] = str(tmp_path / settings["dataDir"])
    broker = BrokerProcess(tmp_path, settings)
    envoy = EnvoyProcess(tmp_path / "envoy.yaml", ports["9901"])
    try:
        broker.start()
        _run_envoy_config(config_cmd, tmp_path)
        envoy.start()
        _client_through_envoy(localize, tmp_path)
        assert envoy.stats()["cluster.kafka-broker-0.upstream_cx_total"] >= 2
        assert "not a trusted proxy" not in broker.log_text()
        assert "PROXY protocol" not in broker.log_text()
    finally:
        envoy.stop()
        if broker.alive():
            broker.stop()


def test_readme_xds_example_runs_end_to_end(tmp_path: Path) -> None:
    """The brokers file as printed, the xds-server and envoy-config commands as printed
    (ports swapped), a real Envoy configured over ADS, the client snippet through it."""
    ports, localize = _localizer()
    brokers_txt, commands = _commands(localize(_block("xds-sh", "sh")))
    assert _block("xds-sh", "sh").startswith("cat > brokers.txt <<'EOF'\n")
    (tmp_path / "brokers.txt").write_text(brokers_txt)
    server_cmd, config_cmd, envoy_cmd = commands
    assert server_cmd[:2] == [".venv/bin/edge-broker", "xds-server"] and server_cmd[-1] == "&"
    assert "brokers.txt" in server_cmd
    assert envoy_cmd == [".venv/bin/envoy", "-c", "envoy-dynamic.yaml", "--disable-hot-restart"]
    broker = _example_broker(localize, tmp_path)
    # run from the repository: the brokers file is given by its full path; the README's
    # --listen and --admin come after XdsProcess's own and win
    xds = XdsProcess(*(str(tmp_path / word) if word == "brokers.txt" else word
                       for word in server_cmd[2:-1]))
    envoy = EnvoyProcess(tmp_path / "envoy-dynamic.yaml", ports["9901"])
    try:
        broker.start()
        xds.start()
        assert xds.grpc_port == ports["18000"]
        _run_envoy_config(config_cmd, tmp_path)
        envoy.start()
        _client_through_envoy(localize, tmp_path)
        assert xds.status()["nodes"]["edge-broker-envoy"]["acked"].get("listeners")
    finally:
        envoy.stop()
        if xds.alive():
            xds.stop()
        if broker.alive():
            broker.stop()


def _settings(words: list[str]) -> dict[str, str]:
    """The ``--set KEY=VALUE`` pairs of a broker command."""
    pairs = [words[i + 1].partition("=") for i, word in enumerate(words) if word == "--set"]
    return {key: value for key, _, value in pairs}


def test_readme_registry_example_runs_end_to_end(tmp_path: Path) -> None:
    """Two brokers on one database as printed (ports and database swapped), the
    xds-server on their registry, Envoy over ADS, the client snippet through Envoy."""
    ports, localize = _localizer(("29090", "29091", "19090", "19091", "9901", "18000",
                                  "18001"))
    printed = "postgres://edge@127.0.0.1:5432/edge"
    url = shared_server().new_database_url()
    script = _block("registry-sh", "sh")
    assert script.count(printed) == 3
    commands = [shlex.split(line) for line in localize(script.replace(printed, url))
                .replace("\\\n", " ").splitlines() if line]
    *broker_cmds, server_cmd, config_cmd, envoy_cmd = commands
    assert [c[:1] + c[-1:] for c in broker_cmds] == [[".venv/bin/edge-broker", "&"]] * 2
    assert server_cmd[:2] == [".venv/bin/edge-broker", "xds-server"] and server_cmd[-1] == "&"
    assert envoy_cmd == [".venv/bin/envoy", "-c", "envoy-dynamic.yaml", "--disable-hot-restart"]
    brokers = [BrokerProcess(tmp_path / f"b{i}", _settings(words))
               for i, words in enumerate(broker_cmds)]
    xds = XdsProcess(*server_cmd[2:-1])
    envoy = EnvoyProcess(tmp_path / "envoy-dynamic.yaml", ports["9901"])
    try:
        for broker in brokers:
            broker.start()
        xds.start()
        assert xds.grpc_port == ports["18000"]
        _run_envoy_config(config_cmd, tmp_path)
        envoy.start(listeners=2)
        client = subprocess.run(
            [sys.executable, "-c", localize(_block("registry-client", "python"))],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert client.returncode == 0, client.stderr
        assert client.stdout.splitlines() == [f"0 127.0.0.1:{ports['19090']}",
                                              f"1 127.0.0.1:{ports['19091']}"]
        text = README.read_text()
        assert "It prints `0 127.0.0.1:19090` and `1 127.0.0.1:19091`." in text
    finally:
        envoy.stop()
        if xds.alive():
            xds.stop()
        for broker in brokers:
            if broker.alive():
                broker.stop()
