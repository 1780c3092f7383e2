"""The alert rules (``deploy/prometheus/alerts.yml``) and the Grafana dashboard
(``deploy/grafana/edge-broker.json``): both parse, each rule and panel has what Prometheus
and Grafana need, every PromQL expression is well formed, and every metric they (and the
READMEs) name is served on a running broker's ``/metrics`` (histograms by their
``_bucket``, ``_sum`` and ``_count`` series; ``up`` is Prometheus's own). Prometheus's
``promtool`` is not used: the Debian package that has it is a whole Prometheus server
(about 100 MB installed)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.broker_process import REPO, BrokerProcess
from tests.ports import free_port

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "edge-broker.json"
READMES = (REPO / "README.md", REPO / "bench" / "README.md")
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes for every target, not served by the broker."""
SEVERITIES = {"critical", "warning", "info"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                             "_created"),
            "summary": ("", "_sum", "_count", "_created"), "gauge": ("",),
            "untyped": ("",), "info": ("_info",), "stateset": ("",), "gaugehistogram": (
                "_bucket", "_gsum", "_gcount")}

# PromQL words that are not metric names: keywords, and aggregation modifiers whose
# parenthesised label lists are dropped before names are read.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"}
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
TOKENS = re.compile(r"""
    (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[smhdwy]?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<call>\s*\()?
  | (?P<other>\S)
""", re.X)


def strip_literals(expr: str) -> str:
    """``expr`` without string literals, label matchers and range selectors."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^{}]*\}", " ", expr)
    expr = re.sub(r"\[[^\[\]]*\]", " ", expr)
    return LABEL_LISTS.sub(" ", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions and keywords left out)."""
    names = set()
    for token in TOKENS.finditer(strip_literals(expr)):
        name = token["name"]
        if name and not token["call"] and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def check_balanced(expr: str) -> None:
    """Brackets pair up and strings close: what a PromQL parser would refuse first."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    assert text.count('"') % 2 == 0, f"unclosed string in {expr!r}"
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            assert stack and stack.pop() == pairs[char], f"unbalanced {char!r} in {expr!r}"
    assert not stack, f"unclosed {stack} in {expr!r}"


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text())
    assert isinstance(document, dict)
    return document


def dashboard_exprs() -> list[str]:
    exprs = [target["expr"] for panel in dashboard()["panels"]
             for target in panel.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["definition"])
            assert match, variable["definition"]
            exprs.append(match[1])
    return exprs


def test_metric_names_are_read_as_prometheus_reads_them() -> None:
    expr = ('histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{api="Produce", '
            'x=~"$i"}[5m] offset 1h))) / on (instance) group_left (job) b_total > bool 2e3 '
            'and predict_linear(c[6h], 86400) < 0 or up{job="x"} == 0 unless d:e:f')
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "up", "d:e:f"}


def test_alert_rules_are_complete() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    groups = [group["name"] for group in document["groups"]]
    assert len(groups) == len(set(groups))
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations",
                             "keep_firing_for"}, rule["alert"]
        assert re.fullmatch(r"EdgeBroker[A-Z]\w+", rule["alert"])
        check_balanced(rule["expr"])
        assert re.fullmatch(r"\d+[smhdwy]", rule.get("for", "0s")), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        for text in rule["annotations"].values():
            check_balanced(text.replace("{{", "(").replace("}}", ")"))
    covered = " ".join(rule["expr"] for rule in rules())
    for what in ("up{", "kop_server_request_latency_seconds_bucket{api=\"Produce\"}",
                 "kop_server_fsync_seconds_bucket", "kop_server_group_lag",
                 "kop_server_authentications_total{outcome=\"failure\"}",
                 "kop_server_quota_throttle_seconds_total",
                 "kop_server_quota_throttled_requests_total",
                 "kop_server_data_dir_usable_bytes"):
        assert what in covered, f"no alert on {what}"


def test_dashboard_is_grafanas() -> None:
    document = dashboard()
    assert document["uid"] and document["title"] and document["schemaVersion"] >= 36
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in document["panels"]:
        position = panel["gridPos"]
        assert position["x"] >= 0 and position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            check_balanced(target["expr"])
            # every kop_server_ selection follows the dashboard's broker choice
            for selector in re.findall(r"kop_server_\w+(\{[^}]*\})?", target["expr"]):
                assert 'instance=~"$instance"' in selector, (panel["title"], target["expr"])
    # panels do not overlap
    cells: set[tuple[int, int]] = set()
    for panel in document["panels"]:
        position = panel["gridPos"]
        mine = {(x, y) for x in range(position["x"], position["x"] + position["w"])
                for y in range(position["y"], position["y"] + position["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


@pytest.fixture(scope="module")
def served_families(tmp_path_factory: pytest.TempPathFactory) -> list[Metric]:
    """The metric families a broker on file storage serves on /metrics."""
    port = free_port()
    broker = BrokerProcess(tmp_path_factory.mktemp("monitoring"),
                           {"metricsPort": str(port)}).start()
    try:
        broker.wait_for_log(rf"metrics on http://127\.0\.0\.1:{port}/metrics")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) \
            .read().decode()
    finally:
        broker.stop()
    return list(text_string_to_metric_families(text))


@pytest.fixture(scope="module")
def served_names(served_families: list[Metric]) -> set[str]:
    """Every series name a broker on file storage serves on /metrics."""
    names = set()
    for family in served_families:
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_metric_named_is_served(source: str, served_names: set[str]) -> None:
    exprs = [rule["expr"] for rule in rules()] if source == "alerts" else dashboard_exprs()
    named = set().union(*(metric_names(expr) for expr in exprs))
    assert "kop_server_fsync_seconds_bucket" in named  # the reading found the names
    missing = sorted(named - served_names - PROMETHEUS_OWN)
    assert missing == [], f"{source} name metrics the broker does not serve: {missing}"


def test_every_metric_the_readmes_name_is_served(served_families: list[Metric],
                                                 served_names: set[str]) -> None:
    """The READMEs name series as a scrape shows them (a counter with its ``_total``), or
    a histogram by its family name."""
    text = "\n".join(path.read_text() for path in READMES)
    named = set(re.findall(r"\bkop_[a-z0-9_]*[a-z0-9]", text))
    assert "kop_server_requests_total" in named  # the reading found the names
    histograms = {family.name for family in served_families
                  if family.type in ("histogram", "summary")}
    missing = sorted(named - served_names - histograms)
    assert missing == [], f"the READMEs name metrics the broker does not serve: {missing}"


def test_the_data_dir_gauges_report_the_file_system(tmp_path: Path) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path, {"metricsPort": str(port)}).start()
    try:
        broker.wait_for_log(rf"metrics on http://127\.0\.0\.1:{port}/metrics")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) \
            .read().decode()
    finally:
        broker.stop()
    values = {sample.name: sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples}
    total, usable = (values["kop_server_data_dir_total_bytes"],
                     values["kop_server_data_dir_usable_bytes"])
    assert 0 < usable <= total
