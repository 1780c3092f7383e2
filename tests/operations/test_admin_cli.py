"""``edge-broker admin`` against a real broker, driven as a subprocess: every verb, in
table and JSON form, with the exit codes scripts rely on (0 done, 1 refused or failed,
2 usage) and one-line errors; on a SASL broker with ACLs, tokens made by ``tokens create``
log in, and what the ACLs refuse exits 1; on an OAUTHBEARER broker, a properties file with
OIDC client credentials (KIP-768 keys) logs in, and a wrong secret is one line, exit 1."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from edge.admin.errors import UsageError
from edge.admin.jaas import parse_jaas, plain_login
from oauth.dev_issuer import DevIssuer
from tests.admin_cli_helpers import Ran, admin, edge_broker, write_properties
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import make_issuer, oauth_file, start_broker
from tests.security_helpers import TokenIssuer, make_tls


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("admin-cli"),
                            {"groupInitialRebalanceDelayMs": "0"}).start()
    yield process
    process.stop()


def ok(ran: Ran) -> Ran:
    assert ran.code == 0, ran.err
    return ran


def test_topics_create_list_describe_alter_grow_delete(broker: BrokerProcess,
                                                       topic_name: str) -> None:
    boot = broker.bootstrap
    created = ok(admin(boot, "topics", "create", topic_name, "--partitions", "2",
                       "--config", "retention.ms=3600000"))
    assert created.out.split() == ["NAME", "RESULT", topic_name, "NONE"]
    again = admin(boot, "topics", "create", topic_name, "--partitions", "2", output="json")
    assert again.code == 1
    assert again.json()["results"][0]["result"].startswith("TOPIC_ALREADY_EXISTS")
    listed = ok(admin(boot, "topics", "list", output="json")).json()["topics"]
    assert {"name": topic_name, "partitions": 2, "internal": False} in listed
    table = ok(admin(boot, "topics", "list")).out.splitlines()
    assert table[0].split() == ["NAME", "PARTITIONS", "INTERNAL"]
    assert [topic_name, "2", "false"] in [line.split() for line in table[1:]]

    ok(admin(boot, "produce", "--partition", "1", topic_name, "a", "b", "c"))
    ok(admin(boot, "topics", "alter-config", topic_name, "--set", "retention.ms=60000",
             "--set", "segment.ms=120000"))
    ok(admin(boot, "topics", "alter-config", topic_name, "--delete", "segment.ms"))
    bad = admin(boot, "topics", "alter-config", topic_name, "--set", "no.such.config=1")
    assert bad.code == 1 and "INVALID_CONFIG" in bad.out
    ok(admin(boot, "topics", "add-partitions", topic_name, "--partitions", "3"))
    described = ok(admin(boot, "topics", "describe", topic_name, output="json")).json()
    assert described["partition_count"] == 3
    assert [(p["partition"], p["leader"], p["start_offset"], p["end_offset"])
            for p in described["partitions"]] == [(0, 0, 0, 0), (1, 0, 0, 3), (2, 0, 0, 0)]
    configs = {c["name"]: c for c in described["configs"]}
    assert configs["retention.ms"]["value"] == "60000"
    assert configs["retention.ms"]["source"] == "DYNAMIC_TOPIC_CONFIG"
    assert configs["segment.ms"]["source"] == "DEFAULT_CONFIG"
    text = ok(admin(boot, "topics", "describe", topic_name)).out
    assert "START_OFFSET  END_OFFSET" in text

    deleted = ok(admin(boot, "topics", "delete", topic_name, output="json")).json()
    assert deleted == {"results": [{"name": topic_name, "result": "NONE"}]}
    gone = admin(boot, "topics", "describe", topic_name)
    assert gone.code == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in gone.one_error_line()


def test_produce_then_consume(broker: BrokerProcess, topic_name: str) -> None:
    boot = broker.bootstrap
    ok(admin(boot, "topics", "create", topic_name, "--partitions", "1"))
    produced = ok(admin(boot, "produce", topic_name, "--key", "k", output="json",
                        stdin="one\ntwo\nthree\n")).json()
    assert produced == {"records": [{"partition": 0, "offset": i} for i in range(3)]}
    consumed = ok(admin(boot, "consume", topic_name, output="json")).json()["records"]
    assert [(r["offset"], r["key"], r["value"]) for r in consumed] == [
        (0, "k", "one"), (1, "k", "two"), (2, "k", "three")]
    some = ok(admin(boot, "consume", topic_name, "--offset", "1", "--max-messages", "1"))
    assert some.out.split() == ["PARTITION", "OFFSET", "KEY", "VALUE", "0", "1", "k", "two"]
    missing = admin(boot, "consume", "no-such-topic-here")
    assert missing.code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.one_error_line()


def commit_in_group(bootstrap: str, topic: str, group: str, count: int) -> None:
    """A kafka-python consumer of ``group`` reads ``count`` records, commits, leaves."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < count and time.monotonic() < deadline:
        seen += sum(len(batch) for batch in consumer.poll(1000, max_records=count - seen)
                    .values())
    assert seen == count
    consumer.commit()
    consumer.close()


def test_groups_list_describe_lag_reset_delete(broker: BrokerProcess, topic_name: str) -> None:
    boot = broker.bootstrap
    group = f"{topic_name}-group"
    ok(admin(boot, "topics", "create", topic_name, "--partitions", "1"))
    ok(admin(boot, "produce", topic_name, "a", "b", "c", "d"))
    commit_in_group(boot, topic_name, group, 4)
    ok(admin(boot, "produce", topic_name, "e", "f"))
    listed = ok(admin(boot, "groups", "list", output="json")).json()["groups"]
    assert {"group": group, "state": "Empty", "protocol_type": "consumer"} in listed
    described = ok(admin(boot, "groups", "describe", group, output="json")).json()
    assert described["state"] == "Empty" and described["members"] == []
    assert described["offsets"] == [{"topic": topic_name, "partition": 0, "committed": 4,
                                     "end_offset": 6, "lag": 2}]
    assert "LAG" in ok(admin(boot, "groups", "describe", group)).out

    dry = ok(admin(boot, "groups", "reset-offsets", group, "--topic", topic_name,
                   "--to-earliest", output="json")).json()
    assert dry["executed"] is False
    assert dry["offsets"] == [{"topic": topic_name, "partition": 0, "current": 4, "new": 0,
                               "result": "dry run"}]
    lag = ok(admin(boot, "groups", "describe", group, output="json")).json()["offsets"]
    assert lag[0]["committed"] == 4  # a dry run changes nothing
    done = ok(admin(boot, "groups", "reset-offsets", group, "--all-topics", "--to-offset",
                    "99", "--execute", output="json")).json()
    assert done["offsets"][0]["new"] == 6 and done["offsets"][0]["result"] == "NONE"
    lag = ok(admin(boot, "groups", "describe", group, output="json")).json()["offsets"]
    assert (lag[0]["committed"], lag[0]["lag"]) == (6, 0)

    deleted = admin(boot, "groups", "delete", group, "no-such-group", output="json")
    assert deleted.code == 1  # one of the two was refused
    assert deleted.json()["results"] == [
        {"group": group, "result": "NONE"},
        {"group": "no-such-group", "result": "GROUP_ID_NOT_FOUND"}]


def test_an_invalid_topic_name_is_named_once(broker: BrokerProcess) -> None:
    """The refusal said "topic name 'bad name!' has an invalid topic 'bad name!'"."""
    refused = admin(broker.bootstrap, "topics", "create", "bad name!", output="json")
    assert refused.code == 1
    [result] = refused.json()["results"]
    assert result["result"].startswith(
        "INVALID_TOPIC: topic name 'bad name!' is invalid: use only ASCII letters")
    refused = admin(broker.bootstrap, "topics", "create", "public/default/bad name!",
                    output="json")
    assert "topic name 'public/default/bad name!' has an invalid topic part 'bad name!'" \
        in refused.json()["results"][0]["result"]


def test_reset_offsets_of_a_group_with_a_live_member_is_refused_first(
        broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's tool checks the group's state before it resets; the commits were sent
    regardless and each partition answered UNKNOWN_MEMBER_ID."""
    boot = broker.bootstrap
    group = f"{topic_name}-live"
    ok(admin(boot, "topics", "create", topic_name, "--partitions", "1"))
    ok(admin(boot, "produce", topic_name, "a", "b"))
    consumer = KafkaConsumer(topic_name, bootstrap_servers=boot, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        seen, deadline = 0, time.monotonic() + 60
        while seen < 2 and time.monotonic() < deadline:
            seen += sum(len(batch) for batch in consumer.poll(1000).values())
        consumer.commit()
        refused = admin(boot, "groups", "reset-offsets", group, "--topic", topic_name,
                        "--to-earliest", "--execute")
        assert refused.code == 1 and refused.out == ""
        assert refused.one_error_line().endswith(
            f"Assignments can only be reset if the group '{group}' is inactive, but the "
            "current state is Stable.")
        dry = ok(admin(boot, "groups", "reset-offsets", group, "--topic", topic_name,
                       "--to-earliest", output="json")).json()  # a dry run shows it
        assert dry["offsets"][0]["new"] == 0
    finally:
        consumer.close()
    described = ok(admin(boot, "groups", "describe", group, output="json")).json()
    assert described["offsets"][0]["committed"] == 2  # nothing was reset


def test_cluster_describe(broker: BrokerProcess) -> None:
    found = ok(admin(broker.bootstrap, "cluster", "describe", output="json")).json()
    assert found["controller_id"] == 0
    assert found["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": broker.port,
                                 "rack": None}]
    assert len(found["cluster_id"]) > 10


def test_usage_errors_exit_2_with_one_line(broker: BrokerProcess, tmp_path: Path) -> None:
    missing_name = admin(broker.bootstrap, "topics", "create")
    assert missing_name.code == 2 and "usage:" in missing_name.err
    assert "Traceback" not in missing_name.err
    no_file = admin(broker.bootstrap, "topics", "list", config=tmp_path / "absent.properties")
    assert no_file.code == 2
    assert "cannot read --command-config" in no_file.one_error_line()
    keystore = write_properties(tmp_path / "java.properties",
                                ssl_truststore_location="/etc/truststore.jks")
    unknown = admin(broker.bootstrap, "topics", "list", config=keystore)
    assert unknown.code == 2
    assert "ssl.truststore.location is read as a PEM file only: set ssl.truststore.type=PEM" \
        in unknown.one_error_line()
    other = write_properties(tmp_path / "other.properties", ssl_cipher_suites="x")
    unknown = admin(broker.bootstrap, "topics", "list", config=other)
    assert unknown.code == 2
    assert "unsupported client property 'ssl.cipher.suites'" in unknown.one_error_line()
    bad_config = admin(broker.bootstrap, "topics", "create", "x", "--config", "novalue")
    assert bad_config.code == 2 and "expected KEY=VALUE" in bad_config.one_error_line()


def test_java_style_pem_stores_connect_over_tls(tmp_path: Path) -> None:
    """A Java client's properties with PEM stores (``ssl.truststore.type=PEM``), as an
    operator's ``--command-config`` for Kafka's own tools holds them."""
    tls = make_tls(tmp_path / "tls")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SSL://127.0.0.1:0", **tls.broker_settings()}).start()
    try:
        config = write_properties(
            tmp_path / "ssl.properties", bootstrap_servers=broker.bootstrap,
            security_protocol="SSL", ssl_truststore_type="PEM",
            ssl_truststore_location=str(tls.ca))
        described = ok(admin(None, "cluster", "describe", config=config, output="json"))
        assert described.json()["brokers"]
    finally:
        broker.stop()


# -- a SASL broker with ACLs --------------------------------------------------------------


@dataclass
class SecureBroker:
    broker: BrokerProcess
    secret_url: str
    directory: Path

    def login_file(self, role: str) -> Path:
        """A properties file logging in as ``role`` of tenant acme with a token that
        ``tokens create`` made."""
        made = ok(admin(self.broker.bootstrap, "tokens", "create", "--secret-key",
                        self.secret_url, "--subject", role, "--expiry", "1h"))
        token = made.out.strip().splitlines()[-1]
        return write_properties(
            self.directory / f"{role}.properties", bootstrap_servers=self.broker.bootstrap,
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
            sasl_username="acme", sasl_password=f"token:{token}")


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    base = tmp_path_factory.mktemp("admin-cli-sasl")
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", **issuer.settings}).start()
    yield SecureBroker(broker, issuer.settings["tokenSecretKey"], base)
    broker.stop()


def test_a_created_token_logs_in(secure: SecureBroker) -> None:
    admin_login = secure.login_file("admin")
    described = ok(admin(None, "cluster", "describe", config=admin_login,
                         output="json")).json()
    assert described["brokers"][0]["port"] == secure.broker.port
    assert "logged in as admin (tenant acme)" in secure.broker.wait_for_log(
        "logged in as admin")


def test_a_jaas_plain_login_logs_in_and_other_modules_say_what_to_use(
        secure: SecureBroker) -> None:
    """Java clients' properties give the PLAIN login as ``sasl.jaas.config``; it was
    refused as an unsupported property."""
    made = ok(admin(None, "tokens", "create", "--secret-key", secure.secret_url,
                    "--subject", "admin"))
    token = made.out.strip().splitlines()[-1]
    module = "org.apache.kafka.common.security.plain.PlainLoginModule"
    jaas = secure.directory / "jaas.properties"
    jaas.write_text(f"bootstrap.servers={secure.broker.bootstrap}\n"
                    "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    f'sasl.jaas.config={module} required \\\n  username="acme" '
                    f'password="token:{token}";\n')
    described = ok(admin(None, "cluster", "describe", config=jaas, output="json")).json()
    assert described["brokers"][0]["port"] == secure.broker.port

    def refusal(value: str) -> str:
        path = write_properties(secure.directory / "bad-jaas.properties",
                                sasl_mechanism="PLAIN", sasl_jaas_config=value)
        ran = admin(secure.broker.bootstrap, "topics", "list", config=path)
        assert ran.code == 2
        return ran.one_error_line()

    oauth = refusal("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                    'required clientId="c" clientSecret="hidden-secret";')
    assert "set sasl.mechanism=OAUTHBEARER with sasl.oauthbearer.token.endpoint.url" in oauth
    assert "hidden-secret" not in oauth
    scram = refusal('org.apache.kafka.common.security.scram.ScramLoginModule required '
                    'username="u" password="hidden-secret";')
    assert "login module 'org.apache.kafka.common.security.scram.ScramLoginModule' is not " \
        "supported here" in scram and "hidden-secret" not in scram
    unclosed = refusal(f'{module} required username="u" password="hidden-secret;')
    assert "a quoted value is not closed" in unclosed and "hidden-secret" not in unclosed
    assert "needs password" in refusal(f'{module} required username="u";')


def test_jaas_option_syntax() -> None:
    """Kafka's JAAS option syntax: quotes of either kind, escapes, comments, a flag in
    any case, the trailing ``;``."""
    module = "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert parse_jaas(f"{module} Required username='a b' /* note */ password=\"q\\\"t\\\\\";"
                      " // end") == (module, {"username": "a b", "password": 'q"t\\'})
    assert plain_login(f'{module} required username=alice password="s3cret";') == (
        "alice", "s3cret")
    for wrong, said in ((f'{module} required username="a"', "do not end with ';'"),
                        (f"{module} username=a;", "control flag"),
                        (f"{module} required username=;", "no value for option 'username'"),
                        (f"{module} required a=b; {module} required c=d;", "one login module"),
                        (f"{module} required password=se!cret;", "outside quotes")):
        with pytest.raises(UsageError, match=re.escape(said)) as caught:
            parse_jaas(wrong)
        assert "cret" not in str(caught.value)


def test_the_secret_key_help_recommends_a_file() -> None:
    """``--secret-key data:...`` puts the secret in argv, which ``ps`` shows to every
    user: the help says so and recommends ``file:``."""
    helped = edge_broker("admin", "tokens", "create", "--help")
    assert helped.code == 0
    text = " ".join(helped.out.split())
    assert "file:/path (recommended: a data: URL on the command line is visible to every " \
        "user in ps" in text


def test_tokens_create_prints_the_token_last_and_inspect_verifies_it(
        secure: SecureBroker) -> None:
    made = ok(admin(None, "tokens", "create", "--secret-key", secure.secret_url,
                    "--subject", "alice", "--expiry", "30m", "--claim", "team=billing"))
    lines = made.out.strip().splitlines()
    token = lines[-1]
    assert token.count(".") == 2 and " " not in token
    assert any(line.split() == ["subject", "alice"] for line in lines)
    as_json = ok(admin(None, "--output", "json", "tokens", "create", "--secret-key",
                       secure.secret_url, "--subject", "alice")).json()
    assert as_json["algorithm"] == "HS256" and as_json["token"].count(".") == 2
    inspected = ok(admin(None, "tokens", "inspect", f"token:{token}", "--secret-key",
                         secure.secret_url, output="json")).json()
    assert inspected["verified"] is True and inspected["subject"] == "alice"
    claims = {c["claim"]: c["value"] for c in inspected["claims"]}
    assert claims["team"] == "billing" and claims["exp"] - claims["iat"] == 1800
    other = "data:;base64," + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()
    wrong = admin(None, "tokens", "inspect", token, "--secret-key", other,
                  output="json")
    assert wrong.code == 1
    assert wrong.json()["verified"] is False and wrong.json()["reason"]
    unverified = ok(admin(None, "tokens", "inspect", "-", stdin=token + "\n",
                          output="json")).json()
    assert unverified["verified"] is None


def test_acls_and_a_refused_call(secure: SecureBroker, topic_name: str) -> None:
    boot = secure.broker.bootstrap
    admin_login, bob = secure.login_file("admin"), secure.login_file("bob")
    ok(admin(boot, "topics", "create", topic_name, "--partitions", "1", config=admin_login))
    created = ok(admin(boot, "acls", "create", "--principal", "User:bob", "--operation",
                       "read", "--resource-type", "topic", "--resource-name", topic_name,
                       config=admin_login, output="json")).json()
    binding = {"principal": "User:bob", "host": "*", "operation": "read",
               "permission": "allow", "resource_type": "topic",
               "resource_name": topic_name, "pattern": "literal"}
    assert created == {"created": [binding]}
    listed = ok(admin(boot, "acls", "list", "--principal", "User:bob", config=admin_login,
                      output="json")).json()
    assert binding in listed["acls"]
    assert "User:bob" in ok(admin(boot, "acls", "list", config=admin_login)).out

    refused = admin(boot, "acls", "list", config=bob)
    assert refused.code == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused.one_error_line()
    denied = admin(boot, "produce", topic_name, "x", config=bob)
    assert denied.code == 1
    # bob may only read: the idempotent producer gets no producer id, as from Kafka
    # (KIP-679: IDEMPOTENT_WRITE on the cluster or WRITE on some topic)
    assert "ClusterAuthorizationFailed" in denied.one_error_line()
    create = admin(boot, "topics", "create", f"{topic_name}-bob", config=bob, output="json")
    assert create.code == 1
    assert create.json()["results"][0]["result"].startswith("TOPIC_AUTHORIZATION_FAILED")

    deleted = ok(admin(boot, "acls", "delete", "--principal", "User:bob", "--resource-type",
                       "topic", "--resource-name", topic_name, config=admin_login,
                       output="json")).json()
    assert deleted == {"deleted": [binding]}
    assert ok(admin(boot, "acls", "list", "--principal", "User:bob", config=admin_login,
                    output="json")).json() == {"acls": []}


def test_quotas_alter_and_describe(secure: SecureBroker) -> None:
    boot = secure.broker.bootstrap
    admin_login, bob = secure.login_file("admin"), secure.login_file("bob")
    altered = ok(admin(boot, "quotas", "alter", "--entity", "namespace=acme/cli",
                       "--set", "producer_byte_rate=1048576", "--set",
                       "consumer_byte_rate=2097152", config=admin_login, output="json"))
    assert altered.json() == {"results": [{"entity": "namespace=acme/cli", "result": "NONE"}]}
    found = ok(admin(boot, "quotas", "describe", "--entity", "namespace=acme/cli",
                     config=admin_login, output="json")).json()["quotas"]
    assert found == [
        {"entity": "namespace=acme/cli", "key": "consumer_byte_rate", "value": 2097152.0},
        {"entity": "namespace=acme/cli", "key": "producer_byte_rate", "value": 1048576.0}]
    ok(admin(boot, "quotas", "alter", "--entity", "namespace=acme/cli", "--delete",
             "consumer_byte_rate", config=admin_login))
    text = ok(admin(boot, "quotas", "describe", "--entity", "namespace", config=admin_login))
    assert text.out.split() == ["ENTITY", "KEY", "VALUE", "namespace=acme/cli",
                                "producer_byte_rate", "1048576.0"]
    unknown = admin(boot, "quotas", "alter", "--entity", "planet=mars", "--set",
                    "producer_byte_rate=1", config=admin_login, output="json")
    assert unknown.code == 1
    assert unknown.json()["results"][0]["result"].startswith("INVALID_REQUEST")
    group_acl = ("--principal", "User:bob", "--resource-type", "group", "--resource-name",
                 "quota-test")
    ok(admin(boot, "acls", "create", *group_acl, "--operation", "read",  # bob may log in
             config=admin_login))
    refused = admin(boot, "quotas", "describe", config=bob)
    assert refused.code == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused.one_error_line()
    ok(admin(boot, "acls", "delete", *group_acl, config=admin_login))


# -- OAUTHBEARER logins (OIDC client credentials) -------------------------------------------


@dataclass
class BearerBroker:
    broker: BrokerProcess
    issuer: DevIssuer
    directory: Path

    def login_file(self, client_id: str, secret: str, **extra: str) -> Path:
        """A properties file logging in with OIDC client credentials (KIP-768 keys)."""
        values = {"bootstrap_servers": self.broker.bootstrap,
                  "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER",
                  "sasl_oauthbearer_method": "oidc",
                  "sasl_oauthbearer_token_endpoint_url": f"{self.issuer.url}/token",
                  "sasl_oauthbearer_client_id": client_id,
                  "sasl_oauthbearer_client_secret": secret, **extra}
        return write_properties(self.directory / f"{client_id}-{secret}-{len(extra)}"
                                ".properties", **values)


@pytest.fixture(scope="module")
def bearer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BearerBroker]:
    base = tmp_path_factory.mktemp("admin-cli-oauth")
    issuer = make_issuer()
    broker = start_broker(base, oauth_file(base, issuer.url))
    yield BearerBroker(broker, issuer, base)
    broker.stop()
    issuer.stop()


def test_an_oidc_login_runs_commands(bearer: BearerBroker, topic_name: str) -> None:
    login = bearer.login_file("acme-app", "acme-secret", sasl_oauthbearer_scope="kafka")
    created = ok(admin(None, "topics", "create", topic_name, "--partitions", "1",
                       config=login, output="json")).json()
    assert created == {"results": [{"name": topic_name, "result": "NONE"}]}
    ok(admin(None, "produce", topic_name, "a", "b", config=login))
    consumed = ok(admin(None, "consume", topic_name, config=login, output="json")).json()
    assert [r["value"] for r in consumed["records"]] == ["a", "b"]
    assert (bearer.broker.data_dir / "topics" / "acme" / "default" / topic_name).is_dir()
    bearer.broker.wait_for_log("principal acme-app, tenant acme")


def test_a_wrong_client_secret_is_one_line_and_exit_1(bearer: BearerBroker) -> None:
    wrong = admin(None, "cluster", "describe", config=bearer.login_file("app", "wrong"))
    assert wrong.code == 1 and wrong.out == ""
    assert wrong.one_error_line() == ("edge-broker admin cluster describe: OAuth login "
                                      "failed: invalid_client: bad secret")


def test_oauthbearer_properties_are_checked(bearer: BearerBroker) -> None:
    no_secret = write_properties(
        bearer.directory / "no-secret.properties", sasl_mechanism="OAUTHBEARER",
        sasl_oauthbearer_token_endpoint_url=f"{bearer.issuer.url}/token",
        sasl_oauthbearer_client_id="app")
    missing = admin(bearer.broker.bootstrap, "cluster", "describe", config=no_secret)
    assert missing.code == 2
    assert "OAUTHBEARER needs sasl.oauthbearer.client.secret" in missing.one_error_line()
    unsecured = bearer.login_file("app", "app-secret", sasl_oauthbearer_method="default")
    assert admin(None, "cluster", "describe", config=unsecured).code == 2
    plain = write_properties(bearer.directory / "plain.properties", sasl_mechanism="PLAIN",
                             sasl_oauthbearer_client_id="app")
    stray = admin(bearer.broker.bootstrap, "cluster", "describe", config=plain)
    assert stray.code == 2 and "need sasl.mechanism=OAUTHBEARER" in stray.one_error_line()


def test_usage_and_refusal_lines_name_the_verb_group_and_the_error(
        broker: BrokerProcess, topic_name: str) -> None:
    both = admin(broker.bootstrap, "topics", "alter-config", topic_name,
                 "--set", "retention.ms=1000", "--delete", "retention.ms")
    assert both.code == 2
    assert both.one_error_line() == ("edge-broker admin topics alter-config: --set and "
                                     "--delete of the same key: retention.ms")
    refused = admin(broker.bootstrap, "groups", "delete-offsets", f"{topic_name}-group",
                    "--topic", "bad name")
    assert refused.code == 1
    assert refused.one_error_line() == ("edge-broker admin groups delete-offsets: cannot "
                                        "describe topic bad name: INVALID_TOPIC")
