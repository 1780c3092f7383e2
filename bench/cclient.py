"""librdkafka's own load generator, ``rdkafka_performance``, built from the sources that
npm's ``node-rdkafka`` tarball carries.

A Python producer or consumer runs out of CPU long before either broker does at small
records; this C client does not, so its rows measure the brokers. The example is built
once and kept in ``.cache/`` at the top of the repository: linked against the librdkafka
that the ``confluent-kafka`` wheel bundles (with OpenSSL, so the TLS rows use it too: the
very library the Python clients run, the version the report names), which takes seconds
(``configure`` for the headers, then the one file); where the wheel bundles none, with a
static librdkafka built from the same sources (about a minute on two cores). Processes
that want it at once (a parallel test run) wait for one build under a file lock.
``$RDKAFKA_PERFORMANCE`` points at a binary built elsewhere. Building needs a C compiler,
``make`` and the zlib and OpenSSL headers (the Makefile's Debian packages); without them
the benchmark says why and leaves the rows out.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

NODE_RDKAFKA = "3.6.1"  # carries librdkafka 2.12.0
TARBALL = f"https://registry.npmjs.org/node-rdkafka/-/node-rdkafka-{NODE_RDKAFKA}.tgz"
INTEGRITY = ("sha512-sfpTbrT35429cs0RE8Yb9avGX9BiRRvpV7aweQsghKTjtrVZP3jBrKOPItWXAqHb8doyh3"
             "SkuGuUVBLgig1SRg==")  # npm's dist.integrity of that version
REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / f"node-rdkafka-{NODE_RDKAFKA}"
LOCK = CACHE.with_name(CACHE.name + ".lock")


def bundled_librdkafka() -> Path | None:
    """The shared librdkafka the installed ``confluent-kafka`` wheel carries, if any."""
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).parent.parent / "confluent_kafka.libs"
    return next(iter(sorted(libs.glob("librdkafka*.so*"))), None)


def _binary(library: Path | None) -> Path:
    """Where the build against ``library`` (None: the static one) is kept."""
    return CACHE / ("rdkafka_performance-ssl" if library is None
                    else f"rdkafka_performance-{library.name}")
# Only what the benchmark uses: OpenSSL (the system's libssl-dev) for the TLS rows, no
# GSSAPI, zstd or curl; SASL PLAIN, lz4 and snappy are built in.
CONFIGURE = ["./configure", "--disable-gssapi", "--disable-zstd", "--disable-curl",
             "--disable-lz4-ext"]


class BuildError(RuntimeError):
    """The C client could not be fetched or built."""


def _say(what: str) -> None:
    print(f"[bench] {what}", file=sys.stderr, flush=True)


def _check_integrity(data: bytes) -> None:
    algorithm, _, expected = INTEGRITY.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if digest != expected:
        raise BuildError(f"{TARBALL}: {algorithm} digest {digest} is not the pinned one")


def _fetch(into: Path) -> Path:
    """Download and unpack the tarball; return librdkafka's source folder."""
    with urllib.request.urlopen(TARBALL, timeout=120) as response:
        data = response.read()
    _check_integrity(data)
    archive = into / "node-rdkafka.tgz"
    archive.write_bytes(data)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    source = into / "package" / "deps" / "librdkafka"
    if not (source / "configure").exists():
        raise BuildError(f"{TARBALL} has no deps/librdkafka")
    return source


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=900)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise BuildError(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")


def build(target: Path | None = None, library: Path | None = None) -> Path:
    """Fetch node-rdkafka's librdkafka sources and build ``rdkafka_performance``: linked
    against ``library`` (a shared librdkafka), or with the static library built too."""
    for tool in ("cc", "make"):
        if shutil.which(tool) is None:
            raise BuildError(f"no {tool} on PATH (make deps-debian installs it)")
    target = target if target is not None else _binary(library)
    jobs = str(max(1, len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory(prefix="rdkafka-build-") as temp:
        _say(f"building rdkafka_performance from node-rdkafka {NODE_RDKAFKA} (once)"
             + (f", linked against {library.name}" if library is not None else ""))
        source = _fetch(Path(temp))
        os.chmod(source / "configure", 0o755)
        _run(CONFIGURE, source)
        if library is not None:
            _run(["cc", "-O2", "-I", "src", "-o", "examples/rdkafka_performance",
                  "examples/rdkafka_performance.c", str(library),
                  f"-Wl,-rpath,{library.parent}", "-lm", "-lpthread"], source)
        else:
            _run(["make", "-j", jobs, "-C", "src", "librdkafka.a"], source)
            _run(["make", "-C", "examples", "rdkafka_performance"], source)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        shutil.copy2(source / "examples" / "rdkafka_performance", partial)
        partial.replace(target)
    return target


def rdkafka_performance() -> Path:
    """The binary to use: ``$RDKAFKA_PERFORMANCE``, the cached build, or a new build (one
    at a time: a process that finds another building waits for its binary)."""
    configured = os.environ.get("RDKAFKA_PERFORMANCE")
    if configured:
        return Path(configured)
    library = bundled_librdkafka()
    binary = _binary(library)
    if binary.exists():
        return binary
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return binary if binary.exists() else build(binary, library)


def find_or_build() -> str | None:
    """The binary's path, or None (with the reason printed) when it cannot be had."""
    try:
        return str(rdkafka_performance())
    except (BuildError, OSError, subprocess.SubprocessError) as exc:
        _say(f"no C client, its rows are left out: {exc}")
        return None
