"""``deploy/``, checked without Docker (not available here): the Dockerfile's commands are the
README's install and run commands (its C record walker compiled as the Makefile does), the
systemd unit parses (``systemd-analyze verify``) and is hardened, the Compose file parses
and its services, files and ports agree with each other and with the broker's
configuration (and the README's token commands with them), its Envoy bootstrap is the
generator's and passes ``envoy --mode validate``; the image's health probe asks the
configured metrics port."""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_core.codec import record_walk
from edge.config import BrokerConfig, load_config
from edge.health_probe import health_url
from edge.properties import parse_properties
from tests.broker_process import REPO, BrokerProcess
from tests.envoy_helpers import envoy_config, validate
from tests.ports import free_port

DEPLOY = REPO / "deploy"
README = (REPO / "README.md").read_text()
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "edge-broker.service"
COMPOSE = DEPLOY / "compose.yaml"
IMAGE_CONFIG_PATH = "/etc/edge-broker/broker.properties"


def readme_commands(name: str) -> list[str]:
    """The commands of the README's shell block ``<!-- example:NAME -->``, one per line
    (continuation lines joined)."""
    match = re.search(rf"<!-- example:{name} -->\n```sh\n(.*?)```", README, re.S)
    assert match, f"README has no shell example {name!r}"
    return [line.strip() for line in match[1].replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's build stages, each its ``(INSTRUCTION, arguments)`` from its
    ``FROM`` on, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            if word.upper() == "FROM":
                stages.append([])
            stages[-1].append((word.upper(), rest.strip()))
    return stages


def instruction(name: str) -> list[str]:
    """The arguments of the image's (the last stage's) instructions ``name``."""
    return [rest for word, rest in dockerfile_stages()[-1] if word == name]


def compile_command() -> str:
    """The README install command that compiles the C record walker."""
    [command] = [c for c in readme_commands("install") if c.startswith("cc ")]
    return command


def image_config() -> BrokerConfig:
    return load_config(DEPLOY / "broker.properties")


# -- the Dockerfile ------------------------------------------------------------------------

def test_dockerfile_runs_the_readmes_install_and_run_commands() -> None:
    compiling = compile_command()
    assert instruction("RUN") == [c for c in readme_commands("install") if c != compiling]
    # the record walker is compiled in a stage of its own, by the README's command after
    # the README's venv, and the image copies the library to the place it was built for
    *builders, _image = dockerfile_stages()
    [builder] = builders
    name = builder[0][1].split(" AS ")[1]
    runs = [rest for word, rest in builder if word == "RUN"]
    assert runs[-2:] == [readme_commands("install")[0], compiling]
    library = shlex.split(compiling)[shlex.split(compiling).index("-o") + 1]
    assert f"--from={name} {library} {library}" in instruction("COPY")
    [command] = readme_commands("run")
    [cmd] = instruction("CMD")
    assert json.loads(cmd) == shlex.split(command)
    assert shlex.split(command)[-2:] == ["--config", IMAGE_CONFIG_PATH]
    # the file the install commands put there is the one in deploy/
    assert f"install -D -m 0644 deploy/broker.properties {IMAGE_CONFIG_PATH}" in \
        readme_commands("install")


def test_dockerfile_copies_every_package_and_only_what_exists() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]
                ["include"]}
    copied = set()
    for rest in instruction("COPY"):
        if rest.startswith("--from="):
            continue
        *sources, _dest = rest.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file"
            copied.add(source)
    assert packages <= copied, f"the image misses packages {packages - copied}"
    assert {"pyproject.toml", "README.md", "deploy/broker.properties"} <= copied


def test_image_runs_unprivileged_with_its_data_directory_a_volume() -> None:
    config = image_config()
    [user] = instruction("USER")
    assert user not in ("root", "0") and "useradd" in " ".join(instruction("RUN"))
    [useradd] = [c for c in readme_commands("install") if c.startswith("useradd ")]
    assert user in useradd.split()
    [volume] = instruction("VOLUME")
    assert json.loads(volume) == [config.data_dir]
    assert f"install -d -o {user} -g {user} -m 0750 {config.data_dir}" in \
        readme_commands("install")
    listener_ports = {int(spec.rsplit(":", 1)[1]) for spec in config.kafka_listeners.split(",")}
    [exposed] = instruction("EXPOSE")
    assert {int(p) for p in exposed.split()} == listener_ports | {config.metrics_port}


def test_healthcheck_probes_the_metrics_port_of_the_config_the_broker_reads() -> None:
    [healthcheck] = instruction("HEALTHCHECK")
    options, _, cmd = healthcheck.partition(" CMD ")
    assert "--interval=" in options and "--timeout=" in options
    args = json.loads(cmd)
    assert args[:3] == ["/opt/edge-broker/bin/python", "-m", "edge.health_probe"]
    assert args[3:] == ["--config", IMAGE_CONFIG_PATH]
    config = image_config()
    assert config.metrics_port != 0
    assert health_url(config) == f"http://127.0.0.1:{config.metrics_port}/healthz"


# -- the C record walker ---------------------------------------------------------------------

def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name} [?:]?= (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert match, name
    return match[1].strip()


def test_readmes_compile_commands_are_the_makefiles_and_build_a_loadable_walker(
        tmp_path: Path) -> None:
    """Every README line that compiles the record walker is the Makefile's ``$(NATIVE)``
    rule, into a venv's ``lib`` where the broker looks; it builds a library that loads."""
    lines = [line.strip() for line in README.splitlines()
             if line.startswith("cc ") and record_walk.LIBRARY_NAME in line]
    assert compile_command() in lines and len(lines) == 2  # Install and Deployment
    rule = (f"cc {makefile_variable('NATIVE_CFLAGS')} -shared -fPIC -o "
            f"{{venv}}/lib/{record_walk.LIBRARY_NAME} {makefile_variable('NATIVE_SRC')}")
    assert sorted(lines) == sorted(rule.format(venv=venv)
                                   for venv in (".venv", "/opt/edge-broker"))
    assert makefile_variable("NATIVE") == f"$(VENV)/lib/{record_walk.LIBRARY_NAME}"
    (tmp_path / "lib").mkdir()
    built = tmp_path / "lib" / record_walk.LIBRARY_NAME
    subprocess.run(shlex.split(rule.format(venv=tmp_path)), cwd=REPO, check=True, timeout=120)
    walker, note = record_walk.load(str(built))
    assert walker is not None, note


def test_make_bench_installs_the_bench_extra_before_it_runs() -> None:
    """``make bench`` installs py-spy (the ``bench`` extra: ``bench.profile`` samples
    with it) with the clients and Tansu of the ``test`` extra, then runs the benchmark."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(dep.startswith("py-spy") for dep in extras["bench"])
    plan = subprocess.run(["make", "-n", "-B", "bench"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True).stdout.splitlines()
    install = plan.index(".venv/bin/pip install -e '.[test,spark,bench]'")
    assert install < plan.index(".venv/bin/python -m bench ")


# -- the health probe ------------------------------------------------------------------------

def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge.health_probe", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_health_probe_fails_in_one_line_when_it_cannot_ask(tmp_path: Path) -> None:
    off = probe("--set", f"dataDir={tmp_path}")
    assert off.returncode == 1 and "metricsPort is 0" in off.stderr
    assert len(off.stderr.splitlines()) == 1
    port = free_port()
    nobody = probe("--set", f"metricsPort={port}")
    assert nobody.returncode == 1
    assert nobody.stderr.startswith(f"health probe: http://127.0.0.1:{port}/healthz: ")
    assert len(nobody.stderr.splitlines()) == 1
    bad = probe("--set", "metricsPort=nope")
    assert bad.returncode == 1 and "metricsPort" in bad.stderr
    assert health_url(load_config(None, ["metricsHost=::", "metricsPort=9404"])) == \
        "http://[::1]:9404/healthz"


def test_health_probe_asks_a_running_broker(tmp_path: Path) -> None:
    settings = {"dataDir": str(tmp_path / "data"), "metricsHost": "0.0.0.0",
                "metricsPort": str(free_port())}
    config = tmp_path / "broker.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    broker = BrokerProcess(tmp_path / "data", settings).start()
    try:
        result = probe("--config", str(config))
        assert (result.returncode, result.stderr) == (0, "")
    finally:
        broker.stop()
    stopped = probe("--config", str(config))
    assert stopped.returncode == 1 and "Connection refused" in stopped.stderr


# -- the systemd unit ------------------------------------------------------------------------

def unit_entries() -> list[tuple[str, str, str]]:
    """``(section, key, value)`` of the unit file, in order (systemd allows a key twice)."""
    section = ""
    entries = []
    for number, line in enumerate(UNIT.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("["):
            assert stripped.endswith("]"), f"line {number}: {line!r}"
            section = stripped[1:-1]
            continue
        key, sep, value = stripped.partition("=")
        assert sep and key.strip() and section, f"line {number}: {line!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def test_unit_runs_the_readmes_command_as_the_readmes_user() -> None:
    entries = unit_entries()
    assert {s for s, _k, _v in entries} == {"Unit", "Service", "Install"}
    service = {k: v for s, k, v in entries if s == "Service"}
    [command] = readme_commands("run")
    assert service["ExecStart"] == command
    assert service["User"] == service["Group"] == instruction("USER")[0]
    assert f"install -m 0644 deploy/{UNIT.name} /etc/systemd/system/{UNIT.name}" in \
        readme_commands("systemd")
    config = image_config()  # the file the install commands put in /etc/edge-broker
    assert config.data_dir in service["ReadWritePaths"].split()
    assert f"/var/lib/{service['StateDirectory']}" == config.data_dir
    assert service["RestartPreventExitStatus"] == "2"  # bad config / port or dir in use


def test_unit_is_hardened() -> None:
    service = [(k, v) for s, k, v in unit_entries() if s == "Service"]
    settings = dict(service)
    for key, value in {"NoNewPrivileges": "true", "ProtectSystem": "strict",
                       "ProtectHome": "true", "PrivateTmp": "true", "PrivateDevices": "true",
                       "ProtectKernelTunables": "true", "ProtectKernelModules": "true",
                       "ProtectControlGroups": "true", "RestrictSUIDSGID": "true",
                       "LockPersonality": "true", "CapabilityBoundingSet": "",
                       "AmbientCapabilities": ""}.items():
        assert settings.get(key) == value, key
    filters = [v for k, v in service if k == "SystemCallFilter"]
    assert "@system-service" in filters


@pytest.fixture
def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:  # Debian's systemd package (DEBIAN_PACKAGES in the Makefile)
        pytest.skip("systemd-analyze is not installed")
    return found


def test_systemd_analyze_verify_finds_nothing_but_the_missing_install(
        systemd_analyze: str, tmp_path: Path) -> None:
    """Unknown keys, bad values and bad sections are all reported by ``verify``; the one
    complaint allowed is that the broker is not installed in /opt on this machine."""
    unit = tmp_path / UNIT.name
    shutil.copy(UNIT, unit)
    result = subprocess.run([systemd_analyze, "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60)
    executable = shlex.split(dict((k, v) for _s, k, v in unit_entries())["ExecStart"])[0]
    missing = None if Path(executable).exists() else f"Command {executable} is not executable"
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if line.strip() and not (missing and missing in line)]
    assert complaints == []


def test_systemd_analyze_security_rates_the_unit_ok(systemd_analyze: str) -> None:
    result = subprocess.run([systemd_analyze, "security", "--offline=true", str(UNIT)],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match[1]) <= 2.0 and match[2] == "OK", match[0]


# -- the Compose file ------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts of a service: container path -> host path (named volumes left out)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *_mode = volume.split(":")
        if source.startswith("."):
            found[target] = (DEPLOY / source).resolve()
    return found


def published(service: dict[str, Any]) -> dict[int, int]:
    """Published ports: container port -> host port."""
    ports = {}
    for spec in service.get("ports", []):
        host, container = str(spec).split(":")
        ports[int(container)] = int(host)
    return ports


def properties(path: Path) -> dict[str, str]:
    return parse_properties(path.read_text())


def test_compose_names_its_services_and_files_that_exist() -> None:
    document = compose()
    services = document["services"]
    assert set(services) == {"broker", "issuer", "envoy", "prometheus", "grafana"}
    build = services["broker"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    for name, service in services.items():
        for target, source in mounts(service).items():
            assert source.exists(), f"{name}: {source} (for {target}) does not exist"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in document["volumes"], (name, volume)
        if service.get("network_mode") == "service:broker":
            assert "ports" not in service, f"{name} shares the broker's network: no ports"
    # the issuer runs the image the broker service builds
    assert services["issuer"]["image"] == services["broker"]["image"]
    # the broker keeps its data in a named volume at its dataDir
    broker_config = load_config(mounts(services["broker"])[IMAGE_CONFIG_PATH])
    assert f"broker-data:{broker_config.data_dir}" in services["broker"]["volumes"]


def test_compose_ports_and_addresses_agree() -> None:
    services = compose()["services"]
    broker_mounts = mounts(services["broker"])
    config = load_config(broker_mounts[IMAGE_CONFIG_PATH])
    envoy_yaml = mounts(services["envoy"])["/etc/envoy/envoy.yaml"]
    assert services["envoy"]["command"][:3] == ["envoy", "-c", "/etc/envoy/envoy.yaml"]
    bootstrap = yaml.safe_load(envoy_yaml.read_text())
    [listener] = bootstrap["static_resources"]["listeners"]
    envoy_port = listener["address"]["socket_address"]["port_value"]
    # Envoy's listener is published (on the broker service, whose network Envoy shares)
    # and is the address the broker advertises
    assert published(services["broker"]) == {envoy_port: envoy_port}
    advertised = config.kafka_advertised_listeners.split("://", 1)[1]
    assert advertised == f"localhost:{envoy_port}"
    # Envoy proxies to the broker's listener
    [cluster] = bootstrap["static_resources"]["clusters"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    upstream = endpoint["address"]["socket_address"]
    listener_address = config.kafka_listeners.split("://", 1)[1]
    assert f"{upstream['address']}:{upstream['port_value']}" == listener_address
    # the OAUTHBEARER validator file is mounted where the broker looks, and names the
    # issuer's port
    assert config.kop_oauth2_config_file in broker_mounts
    oauth = properties(broker_mounts[config.kop_oauth2_config_file])
    issuer = services["issuer"]["command"]
    assert issuer[1] == "dev-issuer"
    issuer_port = issuer[issuer.index("--port") + 1]
    assert oauth["oauth.issuer.url"] == f"http://127.0.0.1:{issuer_port}"
    assert "OAUTHBEARER" in config.sasl_allowed_mechanisms
    # Prometheus scrapes the broker's metrics port, which listens beyond loopback
    prometheus_mounts = mounts(services["prometheus"])
    scrape = yaml.safe_load(prometheus_mounts["/etc/prometheus/prometheus.yml"].read_text())
    [job] = scrape["scrape_configs"]
    assert job["job_name"] == "edge-broker"  # the job the alert rules and dashboard name
    assert job["static_configs"][0]["targets"] == [f"broker:{config.metrics_port}"]
    assert config.metrics_host == "0.0.0.0"
    for rule_file in scrape["rule_files"]:
        assert prometheus_mounts[rule_file] == (DEPLOY / "prometheus" / "alerts.yml").resolve()
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    # Grafana finds Prometheus and the dashboard
    grafana = mounts(services["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    assert source["url"] == f"http://prometheus:{next(iter(published(services['prometheus'])))}"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "edge-broker.yml").read_text())[
        "providers"]
    dashboards = [t for t in grafana if t.startswith(provider["options"]["path"] + "/")]
    assert [grafana[t] for t in dashboards] == [(DEPLOY / "grafana" / "edge-broker.json")
                                                .resolve()]


def test_compose_token_commands_use_the_compose_key_and_the_issuers_client() -> None:
    services = compose()["services"]
    exec_prefix = ["docker", "compose", "-f", "deploy/compose.yaml", "exec", "broker",
                   "/opt/edge-broker/bin/edge-broker"]
    plain, oauth = (shlex.split(c) for c in readme_commands("compose-tokens"))
    assert plain[:len(exec_prefix)] == oauth[:len(exec_prefix)] == exec_prefix
    plain, oauth = plain[len(exec_prefix):], oauth[len(exec_prefix):]
    # SASL/PLAIN: signed with the Compose broker's key; the command runs as printed
    broker_properties = properties(mounts(services["broker"])[IMAGE_CONFIG_PATH])
    assert plain[plain.index("--secret-key") + 1] == broker_properties["tokenSecretKey"]
    made = subprocess.run([sys.executable, "-m", "edge.cli", *plain], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    # SASL/OAUTHBEARER: the issuer's address and its one client
    assert oauth[0] == "token"
    issuer = services["issuer"]["command"]
    assert oauth[oauth.index("--issuer-url") + 1] == \
        f"http://127.0.0.1:{issuer[issuer.index('--port') + 1]}"
    url = oauth[oauth.index("--credentials-url") + 1]
    prefix = "data:application/json;base64,"
    assert url.startswith(prefix)
    credentials = json.loads(base64.b64decode(url.removeprefix(prefix)))
    assert f"{credentials['client_id']}:{credentials['client_secret']}" == \
        issuer[issuer.index("--client") + 1]


def compose_envoy_args() -> list[str]:
    """The ``envoy-config`` arguments recorded in the Compose bootstrap's header."""
    header = (DEPLOY / "compose" / "envoy.yaml").read_text().splitlines()[1]
    words = shlex.split(header.lstrip("# "))
    assert words[:2] == ["edge-broker", "envoy-config"], header
    return words[2:]


def test_compose_envoy_bootstrap_is_the_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    args = compose_envoy_args()
    assert args[:2] == ["--config", "deploy/compose/broker.properties"]
    monkeypatch.chdir(REPO)
    generated = envoy_config(*args)
    assert (DEPLOY / "compose" / "envoy.yaml").read_text() == generated, (
        "deploy/compose/envoy.yaml drifted: regenerate it with the command in its header")


def test_compose_envoy_bootstrap_passes_envoy_validate() -> None:
    result = validate(DEPLOY / "compose" / "envoy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
