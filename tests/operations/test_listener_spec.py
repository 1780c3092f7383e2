"""Tests for listeners.spec: listener, protocol-map and advertised-listener rules."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from listeners.hosts import is_wildcard, machine_host_name, routable_name
from listeners.spec import (
    ListenerConfigError,
    ListenerSpec,
    SecurityProtocol,
    format_host_port,
    parse_listeners,
    parse_protocol_map,
    select_advertised,
)

P = SecurityProtocol


def test_single_plaintext_listener() -> None:
    (spec,) = parse_listeners("PLAINTEXT://127.0.0.1:9092", "", "")
    assert spec == ListenerSpec(
        name="PLAINTEXT",
        protocol=P.PLAINTEXT,
        host="127.0.0.1",
        port=9092,
        advertised_host="127.0.0.1",
        advertised_port=9092,
        advertised_defaulted=True,
    )


def test_several_listeners_keep_order_and_tolerate_whitespace() -> None:
    specs = parse_listeners(
        "  SSL://a.example:9093 ,\tSASL_PLAINTEXT://b:9094,PLAINTEXT://c:9092 ,SASL_SSL://d:1 ",
        "  ",
        " ",
    )
    assert [(s.name, s.protocol, s.host, s.port) for s in specs] == [
        ("SSL", P.SSL, "a.example", 9093),
        ("SASL_PLAINTEXT", P.SASL_PLAINTEXT, "b", 9094),
        ("PLAINTEXT", P.PLAINTEXT, "c", 9092),
        ("SASL_SSL", P.SASL_SSL, "d", 1),
    ]


def test_protocol_names_are_case_insensitive_without_a_map() -> None:
    (spec,) = parse_listeners("sasl_ssl://h:1", "", "")
    assert spec.name == "SASL_SSL"
    assert spec.protocol is P.SASL_SSL


def test_protocol_map_names_listeners() -> None:
    specs = parse_listeners(
        "INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093",
        " internal : plaintext , EXTERNAL:SASL_SSL, UNUSED:SSL ",
        "",
    )
    assert [(s.name, s.protocol) for s in specs] == [
        ("INTERNAL", P.PLAINTEXT),
        ("EXTERNAL", P.SASL_SSL),
    ]


def test_protocol_map_allows_protocol_names_as_listener_names() -> None:
    (spec,) = parse_listeners("PLAINTEXT://h:1", "PLAINTEXT:SSL", "")
    assert spec.protocol is P.SSL


def test_parse_protocol_map() -> None:
    assert parse_protocol_map("") == {}
    assert parse_protocol_map("a:ssl, B-2 : SASL_PLAINTEXT") == {
        "A": P.SSL,
        "B-2": P.SASL_PLAINTEXT,
    }


def test_ipv6_literal_in_brackets() -> None:
    (spec,) = parse_listeners("PLAINTEXT://[::1]:9092", "", "")
    assert (spec.host, spec.port) == ("::1", 9092)
    assert spec.bind_address == "[::1]:9092"
    (wild,) = parse_listeners("PLAINTEXT://[::]:9092", "", "")
    assert wild.host == "::"
    # kept in the short form, so that every spelling of an address compares equal
    (long,) = parse_listeners("PLAINTEXT://[0:0:0:0:0:0:0:1]:9092", "", "")
    assert long.host == "::1"


@pytest.mark.parametrize("bind", [":9092", "0.0.0.0:9092", "[::]:9092",
                                  "[0:0:0:0:0:0:0:0]:9092", "0:9092"])
def test_a_wildcard_bind_advertises_the_host_name(bind: str) -> None:
    # it advertised the wildcard itself, which sends every remote client to itself
    (spec,) = parse_listeners(f"PLAINTEXT://{bind}", "", "")
    assert is_wildcard(spec.host)
    assert spec.advertised_host == machine_host_name()
    assert spec.advertised_host in (socket.getfqdn(), socket.gethostname())
    assert not is_wildcard(spec.advertised_host) and spec.advertised_host != "localhost"
    assert (spec.advertised_port, spec.advertised_defaulted) == (9092, True)
    assert spec.with_bound_port(40000).advertised_address == f"{spec.advertised_host}:40000"


def test_the_host_name_advertised_is_the_first_that_reaches_this_host() -> None:
    assert routable_name(["kafka-0.example.com", "kafka-0"]) == "kafka-0.example.com"
    # a hosts file mapping the host's name to 127.0.0.1 makes getfqdn() say localhost
    assert routable_name(["localhost", "kafka-0"]) == "kafka-0"
    assert routable_name(["localhost.localdomain", "kafka-0"]) == "kafka-0"
    assert routable_name(["", "0.0.0.0", "127.0.1.1", "::1", "kafka-0"]) == "kafka-0"
    assert routable_name(["localhost", "localhost"]) is None


@pytest.mark.parametrize(("host", "wildcard"), [
    ("0.0.0.0", True), ("0", True), ("0x0", True), ("0.0", True), ("000.000.000.000", True),
    ("::", True), ("0:0:0:0:0:0:0:0", True), ("::0", True), ("::ffff:0.0.0.0", True),
    ("127.0.0.1", False), ("1", False), ("::1", False), ("cafe", False),
    ("dead.beef", False), ("kafka.example.com", False), ("", False),
])
def test_wildcards_in_every_spelling(host: str, wildcard: bool) -> None:
    assert is_wildcard(host) is wildcard


def test_explicit_advertised_listener() -> None:
    specs = parse_listeners(
        "INTERNAL://:9092,EXTERNAL://127.0.0.1:9093",
        "INTERNAL:PLAINTEXT,EXTERNAL:SSL",
        " EXTERNAL://broker.example.com:19093 ",
    )
    internal, external = specs
    assert (internal.advertised_host, internal.advertised_port) == (machine_host_name(), 9092)
    assert internal.advertised_defaulted
    assert (external.host, external.port) == ("127.0.0.1", 9093)
    assert (external.advertised_host, external.advertised_port) == (
        "broker.example.com",
        19093,
    )
    assert not external.advertised_defaulted
    assert external.advertised_address == "broker.example.com:19093"


def test_advertised_ipv6() -> None:
    (spec,) = parse_listeners("PLAINTEXT://:0", "", "PLAINTEXT://[fe80::1%eth0]:9092")
    assert spec.advertised_host == "fe80::1%eth0"
    assert spec.advertised_address == "[fe80::1%eth0]:9092"


def test_port_zero_and_with_bound_port() -> None:
    defaulted, explicit = parse_listeners(
        "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "", "SSL://envoy:10000"
    )
    bound = defaulted.with_bound_port(40001)
    assert (bound.port, bound.advertised_port) == (40001, 40001)
    assert bound.advertised_defaulted
    assert (defaulted.port, defaulted.advertised_port) == (0, 0)  # original unchanged
    bound_explicit = explicit.with_bound_port(40002)
    assert (bound_explicit.port, bound_explicit.advertised_port) == (40002, 10000)
    assert bound_explicit.advertised_host == "envoy"


def test_port_zero_may_repeat() -> None:
    specs = parse_listeners("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "", "")
    assert len(specs) == 2


def test_same_port_on_different_hosts_is_allowed() -> None:
    specs = parse_listeners("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.2:9092", "", "")
    assert len(specs) == 2


def test_specs_are_frozen() -> None:
    (spec,) = parse_listeners("PLAINTEXT://h:1", "", "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.port = 2  # type: ignore[misc]


def test_select_advertised() -> None:
    specs = parse_listeners("A://h:1,B://h:2", "A:PLAINTEXT,B:SSL", "B://x:3")
    assert select_advertised(specs, "B").advertised_address == "x:3"
    assert select_advertised(specs, "b").name == "B"
    assert select_advertised(specs, "MISSING").name == "A"
    assert select_advertised(specs, None).name == "A"
    with pytest.raises(ListenerConfigError):
        select_advertised([], "A")


def test_security_protocol_properties() -> None:
    assert [p for p in P if p.uses_tls] == [P.SSL, P.SASL_SSL]
    assert [p for p in P if p.uses_sasl] == [P.SASL_PLAINTEXT, P.SASL_SSL]
    assert P.from_name(" sasl_plaintext ") is P.SASL_PLAINTEXT
    assert P.from_name("TLS") is None


def test_format_host_port() -> None:
    assert format_host_port("h", 1) == "h:1"
    assert format_host_port("::1", 2) == "[::1]:2"


@pytest.mark.parametrize("port", [-1, 65536])
def test_listener_spec_rejects_bad_ports(port: int) -> None:
    with pytest.raises(ListenerConfigError, match="out of range"):
        ListenerSpec("X", P.PLAINTEXT, "h", port, "h", 1)
    with pytest.raises(ListenerConfigError, match="advertised port"):
        ListenerSpec("X", P.PLAINTEXT, "h", 1, "h", port)


def test_listener_spec_rejects_empty_name() -> None:
    with pytest.raises(ListenerConfigError, match="name"):
        ListenerSpec("", P.PLAINTEXT, "h", 1, "h", 1)


ERROR_CASES = [
    # (listeners, protocol map, advertised, fragments of the message, source)
    ("", "", "", ["no listeners"], "listeners"),
    ("  ", "", "", ["no listeners"], "listeners"),
    ("PLAINTEXT://h:1,", "", "", ["empty entry"], "listeners"),
    ("PLAINTEXT://h:1, ,SSL://h:2", "", "", ["empty entry"], "listeners"),
    ("PLAINTEXT:9092", "", "", ["'PLAINTEXT:9092'", "NAME://host:port"], "listeners"),
    ("localhost:9092", "", "", ["'localhost:9092'", "NAME://host:port"], "listeners"),
    ("://h:1", "", "", ["'://h:1'", "listener name"], "listeners"),
    ("PL@IN://h:1", "", "", ["'PL@IN://h:1'", "listener name"], "listeners"),
    ("PLAINTEXT://host", "", "", ["'PLAINTEXT://host'", ":port"], "listeners"),
    ("PLAINTEXT://h:", "", "", ["'PLAINTEXT://h:'", "invalid port"], "listeners"),
    ("PLAINTEXT://h:abc", "", "", ["'PLAINTEXT://h:abc'", "invalid port 'abc'"], "listeners"),
    ("PLAINTEXT://h:-1", "", "", ["invalid port '-1'"], "listeners"),
    ("PLAINTEXT://h:65536", "", "", ["'PLAINTEXT://h:65536'", "65536"], "listeners"),
    ("PLAINTEXT://h$st:1", "", "", ["'PLAINTEXT://h$st:1'", "invalid host"], "listeners"),
    ("PLAINTEXT://::1:9092", "", "", ["'PLAINTEXT://::1:9092'", "brackets"], "listeners"),
    ("PLAINTEXT://[::1:9092", "", "", ["'PLAINTEXT://[::1:9092'", "unclosed"], "listeners"),
    ("PLAINTEXT://[::1]9092", "", "", ["'PLAINTEXT://[::1]9092'", ":port"], "listeners"),
    ("PLAINTEXT://[::1]", "", "", [":port"], "listeners"),
    ("PLAINTEXT://[127.0.0.1]:1", "", "", ["'127.0.0.1'", "not an IPv6"], "listeners"),
    ("PLAINTEXT://[]:1", "", "", ["not an IPv6"], "listeners"),
    ("FOO://h:1", "", "", ["'FOO://h:1'", "not a security protocol"], "listeners"),
    (
        "PLAINTEXT://h:1,PLAINTEXT://h:2",
        "",
        "",
        ["'PLAINTEXT://h:2'", "duplicate listener name 'PLAINTEXT'"],
        "listeners",
    ),
    ("plaintext://h:1,PLAINTEXT://h:2", "", "", ["duplicate"], "listeners"),
    ("A://h:1,a://h:2", "A:SSL", "", ["duplicate listener name 'A'"], "listeners"),
    (
        "A://h:1,B://h:2",
        "A:PLAINTEXT",
        "",
        ["'B://h:2'", "'B'", "not in the protocol map"],
        "listeners",
    ),
    (
        "PLAINTEXT://h:1",
        "INTERNAL:PLAINTEXT",
        "",
        ["'PLAINTEXT'", "not in the protocol map"],
        "listeners",
    ),
    ("PLAINTEXT://h:9092,SSL://h:9092", "", "", ["'PLAINTEXT'", "'SSL'", "bind"], "listeners"),
    ("PLAINTEXT://:9092,SSL://h:9092", "", "", ["both bind"], "listeners"),
    ("PLAINTEXT://[::]:9092,SSL://127.0.0.1:9092", "", "", ["both bind"], "listeners"),
    ("PLAINTEXT://[0:0:0:0:0:0:0:0]:9092,SSL://127.0.0.1:9092", "", "", ["both bind"],
     "listeners"),
    ("PLAINTEXT://0:9092,SSL://127.0.0.1:9092", "", "", ["both bind"], "listeners"),
    # protocol map
    ("A://h:1", "A", "", ["'A'", "NAME:PROTOCOL"], "protocol_map"),
    ("A://h:1", "A:SSL:X", "", ["'A:SSL:X'", "NAME:PROTOCOL"], "protocol_map"),
    ("A://h:1", ":SSL", "", ["':SSL'", "NAME:PROTOCOL"], "protocol_map"),
    ("A://h:1", "A:FOO", "", ["'A:FOO'", "unknown security protocol 'FOO'"], "protocol_map"),
    ("A://h:1", "A:", "", ["'A:'", "unknown security protocol"], "protocol_map"),
    ("A://h:1", "A B:SSL", "", ["'A B:SSL'", "invalid listener name"], "protocol_map"),
    ("A://h:1", "A:SSL,a:PLAINTEXT", "", ["'a:PLAINTEXT'", "mapped twice"], "protocol_map"),
    ("A://h:1", "A:SSL,,B:SSL", "", ["empty entry"], "protocol_map"),
    # advertised listeners
    (
        "PLAINTEXT://h:1",
        "",
        "SSL://x:1",
        ["'SSL://x:1'", "'SSL'", "no listener of that name"],
        "advertised",
    ),
    (
        "PLAINTEXT://h:1",
        "",
        "PLAINTEXT://x:1,PLAINTEXT://y:2",
        ["'PLAINTEXT://y:2'", "duplicate"],
        "advertised",
    ),
    ("PLAINTEXT://h:1", "", "PLAINTEXT://:1", ["'PLAINTEXT://:1'", "needs a host"], "advertised"),
    # a wildcard sends every client to itself (Kafka refuses 0.0.0.0 too)
    *(
        ("PLAINTEXT://h:1", "", f"PLAINTEXT://{host}:1",
         [f"'PLAINTEXT://{host}:1'", f"nonroutable meta-address {shown} "], "advertised")
        for host, shown in [("0.0.0.0", "0.0.0.0"), ("[::]", "::"),
                            ("[0:0:0:0:0:0:0:0]", "::"), ("[::ffff:0.0.0.0]", "::ffff:0:0"),
                            ("0", "0"), ("0x0", "0x0")]
    ),
    ("INTERNAL://:1,EXTERNAL://0.0.0.0:2", "INTERNAL:PLAINTEXT,EXTERNAL:SSL",
     "EXTERNAL://0.0.0.0:9093", ["'EXTERNAL://0.0.0.0:9093'", "nonroutable"], "advertised"),
    ("PLAINTEXT://h:1", "", "PLAINTEXT://x:0", ["'PLAINTEXT://x:0'", "non-zero"], "advertised"),
    ("PLAINTEXT://h:1", "", "FOO://x:1", ["'FOO://x:1'", "not a security protocol"], "advertised"),
    ("A://h:1", "A:SSL", "B://x:1", ["'B://x:1'", "not in the protocol map"], "advertised"),
    ("A://h:1", "A:SSL,B:SSL", "B://x:1", ["'B'", "no listener of that name"], "advertised"),
    ("PLAINTEXT://h:1", "", "PLAINTEXT://x:99999", ["out of range"], "advertised"),
    ("PLAINTEXT://h:1", "", "PLAINTEXT://x", [":port"], "advertised"),
    ("PLAINTEXT://h:1", "", "PLAINTEXT://x:1,", ["empty entry"], "advertised"),
]


@pytest.mark.parametrize(("listeners", "protocol_map", "advertised", "fragments", "source"),
                         ERROR_CASES)
def test_errors(
    listeners: str, protocol_map: str, advertised: str, fragments: list[str], source: str
) -> None:
    with pytest.raises(ListenerConfigError) as info:
        parse_listeners(listeners, protocol_map, advertised)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert info.value.source == source


def test_listener_config_error_is_a_value_error() -> None:
    assert issubclass(ListenerConfigError, ValueError)
