"""`edge-broker certs`: a throw-away CA and the certificates it signed, for the hosts asked
for, private keys readable by the owner only, and files already there kept unless --force.
A TLS client that trusts only ca.pem accepts the server certificate on a real socket."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

from cryptography import x509

from tests.broker_process import REPO


def certs(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge.cli", "certs", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_writes_a_ca_a_server_and_a_client_certificate(tmp_path: Path) -> None:
    done = certs(tmp_path, "--dir", "tls", "--host", "127.0.0.2", "--host", "broker.test",
                 "--client", "alice", "--days", "3")
    assert done.returncode == 0, done.stderr
    names = ["ca.pem", "server.pem", "server.key", "client.pem", "client.key"]
    assert done.stdout.splitlines() == [f"wrote tls/{name}" for name in names]
    directory = tmp_path / "tls"
    assert {p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()} == {
        "ca.pem": 0o644, "server.pem": 0o644, "server.key": 0o600,
        "client.pem": 0o644, "client.key": 0o600}
    ca, server, client = (_load(directory / n) for n in ("ca.pem", "server.pem", "client.pem"))
    server.verify_directly_issued_by(ca)
    client.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.2")]
    assert san.get_values_for_type(x509.DNSName) == ["broker.test"]
    assert client.subject.rfc4514_string() == "CN=alice"
    assert (server.not_valid_after_utc - server.not_valid_before_utc).days == 3


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    assert certs(tmp_path).returncode == 0
    before = (tmp_path / "certs" / "server.key").read_bytes()
    again = certs(tmp_path)
    assert again.returncode == 2
    assert again.stderr.startswith("edge-broker certs: already there (use --force")
    assert len(again.stderr.splitlines()) == 1
    assert (tmp_path / "certs" / "server.key").read_bytes() == before
    assert certs(tmp_path, "--force").returncode == 0
    assert (tmp_path / "certs" / "server.key").read_bytes() != before
    bad = certs(tmp_path, "--dir", "other", "--days", "0")
    assert (bad.returncode, bad.stderr) == (2, "edge-broker certs: days must be at least 1, "
                                               "not 0\n")


def test_a_client_trusting_the_ca_accepts_the_server(tmp_path: Path) -> None:
    assert certs(tmp_path).returncode == 0
    directory = tmp_path / "certs"
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(directory / "server.pem", directory / "server.key")
    client_side = ssl.create_default_context(cafile=str(directory / "ca.pem"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with server_side.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"hello")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        for name in ("127.0.0.1", "localhost"):  # checked against the certificate's names
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    client_side.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.recv(5) == b"hello"
        thread.join(10)
        assert not thread.is_alive(), "the TLS server did not finish"
