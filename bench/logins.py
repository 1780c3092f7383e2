"""The login rows: ``python -m bench.logins``.

Three brokers (this one, default settings, one SASL_PLAINTEXT listener each), one after
another: SASL/PLAIN with HS256 ``token:`` passwords (``tokenSecretKey``), SASL/PLAIN with
RS256 ones (``tokenPublicKey``), and OAUTHBEARER checked against a JWKS (the project's
dev issuer on loopback, ``kopOauth2ConfigFile``; RS256). The load generator
(``bench.login_worker``) logs in ``--logins`` times with 32 logins under way at once,
each with a token of its own (signed beforehand), then as often with one token over and
over (a fleet reconnecting with the tokens it holds). Logins per second of the broker's
CPU (its own CPU time from ``/proc``) is "per broker core".

The limit is pyjwt's own signature check of one such token (``Algorithm.verify`` with the
key parsed once: the library the broker uses), timed on the broker's CPU; beside it
pyjwt's whole ``jwt.decode``. Target: logins per broker core at least half the limit.

Then the **login storm**: on the RS256 PLAIN broker, a producer logged in beforehand sends
``--storm-rate`` records/s of 1 KiB (``bench.worker latency``, acks=all, linger.ms=5)
for ``--storm-seconds``, during which ``--storms`` storms of ``--storm-clients`` logins
at once (each client with a token of its own) start evenly spaced, against the same
producer with no storm, trials alternating. Target: the storm does not raise its p99
more than 2x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jwt
from jwt.algorithms import AllowedPublicKeys

from bench.admin import create_topic, delete_topic
from bench.options import RESULTS, Options
from bench.pinning import CpuPlan, inherited_affinity, pin_self, plan_cpus
from bench.report import save_row
from bench.runner import Bench, LoadError, run_worker
from bench.secure import Material, MultiListenerBroker, TempMaterial, as_flags, client_config
from oauth.dev_issuer import DevClient, DevIssuer

KINDS = ("PLAIN HS256", "PLAIN RS256", "OAUTHBEARER JWKS")
SASL = "SASL_PLAINTEXT"


class Signer:
    """Tokens for one kind of login, and the key the broker checks them with."""

    def __init__(self, kind: str, material: Material, issuer: DevIssuer | None) -> None:
        self.kind = kind
        self.material = material
        self.issuer = issuer
        self.mechanism = kind.split()[0]
        self.algorithm = "HS256" if kind.endswith("HS256") else "RS256"

    def token(self) -> str:
        """A new token (its own ``jti``)."""
        if self.issuer is not None:
            return self.issuer.sign(self.issuer.claims_for(self.issuer.clients["app"], None))
        return self.material.token(self.algorithm, jti=uuid.uuid4().hex)

    def verify_key(self) -> AllowedPublicKeys | bytes:
        """The key the broker checks signatures with, parsed as pyjwt parses it."""
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        if self.algorithm == "HS256":
            return self.material.hmac_secret
        if self.issuer is not None:
            jwks = self.issuer.keys.public_jwks()
            key: AllowedPublicKeys = jwt.PyJWK(dict(jwks["keys"][0])).key
            return key
        public: AllowedPublicKeys = algorithm.prepare_key(self.material.rsa_public.read_bytes())
        return public

    def broker_settings(self, directory: Path) -> dict[str, str]:
        """The broker's keys for this kind."""
        if self.issuer is None:
            tokens = (self.material.hs256_settings() if self.algorithm == "HS256"
                      else self.material.rs256_settings())
            return {**tokens, "saslAllowedMechanisms": "PLAIN"}
        properties = directory / "oauth.properties"
        properties.write_text(f"oauth.issuer.url={self.issuer.url}\n"
                              f"oauth.audience={self.issuer.audience}\n", encoding="utf-8")
        return {"saslAllowedMechanisms": "OAUTHBEARER", "kopOauth2ConfigFile": str(properties)}


def _per_second(call: Callable[[], object], seconds: float) -> float:
    """How many calls a second, the best of three runs of about ``seconds`` / 3."""
    timer = timeit.Timer(call)
    count, spent = timer.autorange()
    runs = max(1, int(count * seconds / 3 / max(spent, 1e-9)))
    return runs / min(timer.repeat(3, runs))


def limit(signer: Signer, cpus: CpuPlan, seconds: float) -> dict[str, float]:
    """Signature checks (and whole decodes) per second of one token, on the broker's CPU."""
    token = signer.token()
    signing_input, _, signature = token.rpartition(".")
    raw_signature = jwt.utils.base64url_decode(signature)
    algorithm = jwt.get_algorithm_by_name(signer.algorithm)
    key = signer.verify_key()
    prepared = algorithm.prepare_key(key)  # what pyjwt checks with: parsed once
    assert algorithm.verify(signing_input.encode(), prepared, raw_signature)
    with inherited_affinity(cpus.broker):
        checks = _per_second(lambda: algorithm.verify(signing_input.encode(), prepared,
                                                      raw_signature), seconds)
        decodes = _per_second(lambda: jwt.decode(
            token, key, algorithms=[signer.algorithm],
            options={"verify_aud": False, "verify_iss": False}), seconds)
    return {"signature_checks_per_s": checks, "decodes_per_s": decodes}


def _tokens_file(directory: Path, signer: Signer, count: int, name: str) -> Path:
    path = directory / f"{name}.txt"
    path.write_text("".join(signer.token() + "\n" for _ in range(count)), encoding="ascii")
    return path


def _login_worker(port: int, signer: Signer, tokens: Path, mode: str,
                  **extra: float) -> list[str]:
    args = [sys.executable, "-m", "bench.login_worker", mode, "--port", str(port),
            "--mechanism", signer.mechanism, "--tokens", str(tokens)]
    for key, value in extra.items():
        args += ["--" + key, f"{value:g}"]
    return args


def _run_logins(bench: Bench, broker: MultiListenerBroker, command: list[str]
                ) -> dict[str, Any]:
    cpu0 = broker.cpu_seconds()
    out = subprocess.run(command, capture_output=True, text=True, check=False,
                         timeout=bench.opts.timeout + 60)
    cpu = broker.cpu_seconds() - cpu0
    broker.check_alive()
    if out.returncode != 0 or not out.stdout.strip():
        raise LoadError(f"login worker failed ({out.returncode}):\n{out.stderr[-2000:]}")
    done: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if done["errors"]:
        raise LoadError(f"{done['errors']} logins failed, first: {done['first_error']}")
    seconds = max(float(done["seconds"]), 1e-9)
    return {**done, "broker_cpu_s": cpu, "logins_per_s": done["logins"] / seconds,
            "logins_per_broker_cpu_s": done["logins"] / max(cpu, 0.01),
            "client_bound": float(done["client_cpu_s"]) >= 0.9 * seconds}


def rates(bench: Bench, signer: Signer, args: argparse.Namespace, directory: Path
          ) -> dict[str, Any]:
    """Logins with a token each, then with one token, on a broker of their own."""
    broker = MultiListenerBroker([SASL], signer.broker_settings(directory))
    broker.start(bench.cpus.broker)
    trials: dict[str, list[dict[str, Any]]] = {"distinct": [], "same": []}
    try:
        port = broker.ports[SASL]
        same = _tokens_file(directory, signer, 1, "same")
        # warm up: the broker's first login fetches the JWKS, imports what it needs
        _run_logins(bench, broker, _login_worker(port, signer, same, "rate", count=50))
        for trial in range(args.repeat):
            print(f"[bench] logins {signer.kind}: trial {trial + 1}/{args.repeat}",
                  file=sys.stderr, flush=True)
            distinct = _tokens_file(directory, signer, args.logins, f"distinct-{trial}")
            for kind, tokens in (("distinct", distinct), ("same", same)):
                trials[kind].append(_run_logins(bench, broker, _login_worker(
                    port, signer, tokens, "rate", count=args.logins)))
    finally:
        broker.stop()
    return {kind: {key: statistics.median(float(t[key]) for t in runs)
                   for key in ("logins_per_s", "logins_per_broker_cpu_s", "broker_cpu_s",
                               "client_cpu_s", "seconds")}
            | {"client_bound": sum(t["client_bound"] for t in runs) > len(runs) / 2,
               "trials": runs}
            for kind, runs in trials.items()}


def storm(bench: Bench, material: Material, args: argparse.Namespace, directory: Path
          ) -> dict[str, Any]:
    """An authenticated producer's latency with and without login storms."""
    signer = Signer("PLAIN RS256", material, None)
    extra = dict(setting.split("=", 1) for setting in args.set)
    broker = MultiListenerBroker(["PLAINTEXT", SASL],
                                 {**signer.broker_settings(directory), **extra})
    broker.start(bench.cpus.broker)
    trials: dict[str, list[dict[str, Any]]] = {"quiet": [], "storm": []}
    topic = "bench-storm"
    config = as_flags(client_config(SASL, material, material.token("RS256")))
    try:
        create_topic(broker.bootstrap, topic, 1)
        tokens = _tokens_file(directory, signer, args.storm_clients, "storm")
        for trial in range(args.repeat):
            for kind in ("quiet", "storm") if trial % 2 == 0 else ("storm", "quiet"):
                print(f"[bench] login storm: {kind}, trial {trial + 1}/{args.repeat}",
                      file=sys.stderr, flush=True)
                trials[kind].append(_storm_trial(bench, broker, signer, tokens, topic,
                                                 config, args, kind == "storm"))
    finally:
        delete_topic(broker.bootstrap, topic)
        broker.stop()
    return {kind: {key: statistics.median(float(t[key]) for t in runs)
                   for key in ("p50_ms", "p99_ms", "p999_ms", "achieved_rate")}
            | {"trials": runs} for kind, runs in trials.items()}


def _storm_trial(bench: Bench, broker: MultiListenerBroker, signer: Signer, tokens: Path,
                 topic: str, config: list[str], args: argparse.Namespace, stormy: bool
                 ) -> dict[str, Any]:
    warmup = args.storm_warmup
    spawner = None
    if stormy:
        command = _login_worker(broker.ports[SASL], signer, tokens, "storm",
                                clients=args.storm_clients, storms=args.storms,
                                every=args.storm_seconds / args.storms, delay=warmup + 0.5)
        with inherited_affinity(bench.cpus.load):
            spawner = subprocess.Popen(command, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    phase = run_worker(bench, broker, "latency", topic, size=1024, rate=args.storm_rate,
                       seconds=args.storm_seconds, warmup=warmup,
                       bootstrap=broker.address(SASL), config=config)
    row: dict[str, Any] = {**phase.load, "broker_cpu_s": phase.broker_cpu_s}
    if spawner is not None:
        stdout, stderr = spawner.communicate(timeout=bench.opts.timeout)
        if spawner.returncode != 0 or not stdout.strip():
            raise LoadError(f"storm failed:\n{stderr[-2000:]}")
        row["storm"] = json.loads(stdout.strip().splitlines()[-1])
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The limits, the login rates of every kind, the storm."""
    cpus = plan_cpus(not args.no_pin)
    pin_self(cpus.load)
    bench = Bench(Options(timeout=args.timeout, quick=args.quick), cpus)
    began = time.monotonic()
    results: dict[str, Any] = {"cpus": cpus.describe(), "rows": {},
                               "options": {k: v for k, v in vars(args).items()
                                           if k != "out"}}
    issuer = DevIssuer(clients=[DevClient("app", "app-secret")]).start()
    try:
        with TempMaterial() as material, tempfile.TemporaryDirectory() as temp:
            for kind in args.kinds:
                signer = Signer(kind, material, issuer if "JWKS" in kind else None)
                row = {"limit": limit(signer, cpus, 0.3 if args.quick else 3.0)}
                row.update(rates(bench, signer, args, Path(temp)))
                results["rows"][kind] = row
            if args.storm_clients:
                results["storm"] = storm(bench, material, args, Path(temp))
    finally:
        issuer.stop()
    results["seconds"] = time.monotonic() - began
    return results


def table(results: dict[str, Any]) -> str:
    """The Markdown tables and the targets."""
    parts = []
    if results["rows"]:
        parts.append(_rates_table(results))
    if "storm" in results:
        parts.append(_storm_table(results))
    return "\n\n".join(parts)


def _rates_table(results: dict[str, Any]) -> str:
    rates_run = results.get("rates_run", results)  # kept from an earlier run: --storm-only
    opts = rates_run["options"]
    lines = [f"Logins (connect, ApiVersions, SaslHandshake, SaslAuthenticate; 32 at once), "
             f"{opts['logins']:,} per trial, median of {opts['repeat']}; {rates_run['cpus']}. "
             "Limit: pyjwt's signature check of one token on the broker's CPU.", "",
             "| login | tokens | logins/s | logins per broker CPU s | limit: signature "
             "checks/s (whole jwt.decode/s) | per broker CPU s / limit |",
             "|---|---|--:|--:|--:|--:|"]
    verdicts = []
    for kind, row in results["rows"].items():
        checks = row["limit"]["signature_checks_per_s"]
        for tokens, label in (("distinct", "one per login"), ("same", "one for all")):
            got = row[tokens]
            mark = " (c)" if got["client_bound"] else ""
            share = got["logins_per_broker_cpu_s"] / checks
            lines.append(f"| {kind} | {label} | {got['logins_per_s']:,.0f}{mark} | "
                         f"{got['logins_per_broker_cpu_s']:,.0f} | {checks:,.0f} "
                         f"({row['limit']['decodes_per_s']:,.0f}) | {share:.1%} |")
            if tokens == "distinct":
                verdicts.append((kind, share))
    met = all(share >= 0.5 for _, share in verdicts)
    lines += ["", f"- logins per broker core >= 50% of the signature-check limit (a token "
                  f"per login): **{'met' if met else 'NOT met'}** ("
                  + ", ".join(f"{kind} {share:.1%}" for kind, share in verdicts) + ")"]
    return "\n".join(lines)


def _storm_table(results: dict[str, Any]) -> str:
    opts = results["options"]
    quiet, stormy = results["storm"]["quiet"], results["storm"]["storm"]
    longest = max(t["storm"]["longest_storm_s"] for t in stormy["trials"])
    ratio = stormy["p99_ms"] / max(quiet["p99_ms"], 1e-9)
    lines = [f"Login storm: a SASL/PLAIN (RS256) producer logged in beforehand, "
             f"{opts['storm_rate']:,.0f} records/s x 1 KiB, acks=all, linger.ms=5, "
             f"{opts['storm_seconds']:g} s measured; {opts['storms']} storms of "
             f"{opts['storm_clients']:,} logins at once in that time (the longest "
             f"took {longest:.2f} s); median of {opts['repeat']} trials, interleaved "
             f"(p99 of each trial: no storm "
             + ", ".join(f"{t['p99_ms']:.1f}" for t in quiet["trials"])
             + "; during storms " + ", ".join(f"{t['p99_ms']:.1f}" for t in stormy["trials"])
             + " ms).", "",
             "| producer | p50 ms | p99 ms | p99.9 ms | achieved records/s |",
             "|---|--:|--:|--:|--:|"]
    for label, row in (("no storm", quiet), ("during storms", stormy)):
        lines.append(f"| {label} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                     f"{row['p999_ms']:.2f} | {row['achieved_rate']:,.0f} |")
    lines += ["", f"- a storm of {opts['storm_clients']:,} logins raises the producer's "
                  f"p99 at most 2x: **{'met' if ratio <= 2 else 'NOT met'}** "
                  f"({ratio:.2f}x)"]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.logins", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated: " + ", ".join(KINDS))
    parser.add_argument("--logins", type=int, default=4000, help="logins per trial")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--storm-clients", type=int, default=1000, help="0: no storm rows")
    parser.add_argument("--storm-rate", type=float, default=5000.0)
    parser.add_argument("--storm-seconds", type=float, default=8.0,
                        help="the producer's measured time")
    parser.add_argument("--storm-warmup", type=float, default=2.0,
                        help="the producer's warm-up before its measured time, left out "
                        "(s); the storms start after it")
    parser.add_argument("--storms", type=int, default=2,
                        help="storms in that time, evenly spaced")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the storm's broker (repeatable)")
    parser.add_argument("--storm-only", action="store_true",
                        help="the storm rows only (no limits, no login rates; the rate "
                        "rows already in --out are kept)")
    parser.add_argument("--quick", action="store_true",
                        help="200 logins, one trial, a storm of 100 for 2 s after a "
                        "0.5 s warm-up")
    return parser


def _keep_rates(results: dict[str, Any], earlier: Path) -> None:
    """Keep the login-rate rows of the run saved in ``earlier``, if any (--storm-only)."""
    if not earlier.exists():
        return
    saved: dict[str, Any] = json.loads(earlier.read_text(encoding="utf-8"))
    if saved.get("rows"):
        results["rows"] = saved["rows"]
        results["rates_run"] = saved.get("rates_run") or {"options": saved["options"],
                                                          "cpus": saved["cpus"]}


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the tables, save ``logins.json`` and ``logins.md`` in ``--out``."""
    args = _parser().parse_args(argv)
    args.kinds = [] if args.storm_only else [kind.strip() for kind in args.kinds.split(",")]
    if args.quick:
        args.logins, args.repeat = 200, 1
        args.storm_clients = min(args.storm_clients, 100)
        args.storm_seconds, args.storm_rate = 2.0, 1000.0
        args.storm_warmup = min(args.storm_warmup, 0.5)
    results = run(args)
    if args.storm_only:
        _keep_rates(results, args.out / "logins.json")
    text = table(results)
    print(text, flush=True)
    save_row(args.out, "logins", results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
