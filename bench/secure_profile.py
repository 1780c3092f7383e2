"""``python -m bench.secure_profile tls-consume|tls-produce|logins``: py-spy on this broker
under the load of a TLS or login row (``bench/tls.py``, ``bench/logins.py``).

``tls-consume`` fills a topic over the SSL listener (``--size`` records) and reads it back
over and over with the OpenSSL build of ``rdkafka_performance``; ``tls-produce`` produces
over it; ``--protocol SASL_SSL`` uses that listener instead. ``logins`` runs the login
load generator (``--kind``, a token per login) back to back. The broker is sampled with
``py-spy record --format raw`` (``--native`` adds C frames) for ``--seconds``; the summary
(``bench.stacks``) is printed and saved as ``bench/results/profile-<row>.txt``. Without
py-spy (the bench extra has it; a venv may not) the broker runs under ``cProfile``
instead (its main thread: the event loop; deterministic, so it slows what it measures)
and the summary is pstats' top functions by own and by cumulative time.
"""

from __future__ import annotations

import argparse
import io
import pstats
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.admin import create_topic
from bench.cclient import find_or_build
from bench.logins import KINDS, SASL, Signer, _login_worker, _tokens_file
from bench.options import RESULTS
from bench.pinning import pin_self, plan_cpus
from bench.secure import MultiListenerBroker, TempMaterial, as_flags, client_config
from bench.stacks import parse, render
from oauth.dev_issuer import DevClient, DevIssuer


def _c_command(binary: str, broker: MultiListenerBroker, protocol: str, config: list[str],
               produce: bool, size: int, count: int) -> list[str]:
    command = [binary, "-P" if produce else "-C", "-t", "bench-profile", "-p", "0",
               "-b", broker.address(protocol), "-c", str(count)]
    command += ["-s", str(size), "-X", "acks=all", "-X", "linger.ms=5"] if produce \
        else ["-o", "beginning", "-X", "fetch.queue.backoff.ms=10"]
    for item in config:
        command += ["-X", item]
    return command


def _loop(command: list[str], seconds: float) -> subprocess.Popen[str]:
    once = " ".join(f"'{part}'" for part in command)
    return subprocess.Popen(["bash", "-c", f"end=$((SECONDS+{int(seconds) + 1})); "
                             f"while [ $SECONDS -lt $end ]; do {once} >/dev/null 2>&1; done"],
                            text=True)


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _pstats(path: Path, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs()
    for order in ("tottime", "cumulative"):
        out.write(f"\n-- by {order} --\n")
        stats.sort_stats(order).print_stats(top)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    """Profile one row's load; print and save the summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.secure_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("row", choices=("tls-consume", "tls-produce", "logins"))
    parser.add_argument("--protocol", default="SSL", choices=("SSL", "SASL_SSL"))
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--count", type=int, default=30000)
    parser.add_argument("--kind", default="PLAIN RS256", choices=KINDS)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cpus = plan_cpus(True)
    pin_self(cpus.load)
    issuer = DevIssuer(clients=[DevClient("app", "app-secret")]).start()
    with TempMaterial() as material, tempfile.TemporaryDirectory() as temp:
        if args.row == "logins":
            signer = Signer(args.kind, material, issuer if "JWKS" in args.kind else None)
            broker = MultiListenerBroker([SASL], signer.broker_settings(Path(temp)))
        else:
            broker = MultiListenerBroker(["PLAINTEXT", "SSL", "SASL_SSL"], {
                **material.tls_settings(), **material.hs256_settings()})
        spy_binary = _py_spy()
        cprofile = Path(temp) / "broker.prof"
        if spy_binary is None:
            broker.cprofile_to = cprofile
        broker.start(cpus.broker)
        try:
            if args.row == "logins":
                tokens = _tokens_file(Path(temp), signer, 3000, "profile")
                load = _loop(_login_worker(broker.ports[SASL], signer, tokens, "rate",
                                           count=3000), args.seconds)
                what = f"logins, {args.kind}, a token per login (3,000 in turn)"
            else:
                binary = find_or_build()
                assert binary is not None
                config = as_flags(client_config(args.protocol, material,
                                                material.token("HS256")))
                create_topic(broker.bootstrap, "bench-profile", 1)
                produce = args.row == "tls-produce"
                if not produce:
                    subprocess.run(_c_command(binary, broker, args.protocol, config, True,
                                              args.size, args.count),
                                   check=True, capture_output=True)
                load = _loop(_c_command(binary, broker, args.protocol, config, produce,
                                        args.size, args.count), args.seconds)
                what = f"{args.row} over {args.protocol}, {args.size} B records"
            if spy_binary is not None:
                raw = Path(temp) / "stacks.txt"
                spy = [spy_binary, "record", "--pid", str(broker.pid), "--rate",
                       str(args.rate), "--duration", str(int(args.seconds)), "--format",
                       "raw", "--output", str(raw)]
                spy += ["--native"] if args.native else ["--nonblocking"]
                subprocess.run(spy, capture_output=True, check=True)
            load.wait(args.seconds + 120)
        finally:
            broker.stop()
            issuer.stop()
        if spy_binary is not None:
            summary = render(parse(raw.read_text(encoding="utf-8")), args.top)
            tool = "py-spy, on CPU" + (" (native frames)" if args.native else "")
        else:
            summary = _pstats(cprofile, args.top)
            tool = "cProfile (py-spy not installed), the event loop's thread"
    text = (f"{tool}, {args.seconds:g} s of {what}; {cpus.describe()}\n{summary}\n")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile-{args.row}.txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
