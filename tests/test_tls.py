"""M3: the daemon serves HTTPS with --tls-cert/--tls-key, the CLI and the agent's client verify
it against --ca-file; plain HTTP on an address other than loopback is logged as a warning.
The CA and the server's certificate (for 127.0.0.1, an IP SAN) are made here with openssl."""

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.client import ControlPlane, Unreachable
from tests.daemons import Daemon
from tests.nodes import recorded
from tests.test_cli import Cli, root_cli

CA_CONFIG = """\
[req]
distinguished_name = dn
x509_extensions = ca
prompt = no
[dn]
CN = better-compute test CA
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""
SERVER_EXTENSIONS = """\
subjectAltName = IP:127.0.0.1
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path


def make_certificates(directory: Path) -> Certificates:
    """A self-signed CA, and a server certificate it signs for 127.0.0.1 (P-256 keys)."""
    (directory / "ca.cnf").write_text(CA_CONFIG)
    (directory / "server.ext").write_text(SERVER_EXTENSIONS)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", "-config", "ca.cnf", *ec, "-keyout", "ca.key", "-out", "ca.crt"],
        ["req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr"],
        [
            "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-extfile", "server.ext", "-out", "server.crt",
        ],
    ):  # fmt: skip
        subprocess.run(
            ["openssl", *command, "-days", "2"], cwd=directory, check=True, capture_output=True
        )
    return Certificates(directory / "ca.crt", directory / "server.crt", directory / "server.key")


@dataclass(frozen=True)
class Tls:
    daemon: Daemon
    certificates: Certificates
    cli: Cli  # root's CLI against the https URL, with no CA file


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    """One daemon for the module, serving HTTPS with a certificate of the test's CA."""
    home = tmp_path_factory.mktemp("tls")
    certificates = make_certificates(home)
    running = Daemon(home, "--tls-cert", str(certificates.cert), "--tls-key", str(certificates.key))
    running.url = f"https://127.0.0.1:{running.port}"
    running.start()
    yield Tls(running, certificates, root_cli(running, home))
    running.kill()


def test_m3_the_cli_talks_https_with_the_ca_file(tls: Tls, tmp_path: Path) -> None:
    """M3: --ca-file, BETTER_COMPUTE_CA_FILE and a profile's ca_file each verify the daemon's
    certificate, and the calls are answered."""
    ca = str(tls.certificates.ca)
    assert tls.cli("--ca-file", ca, "-o", "json", "whoami").json()["tenantId"] == "root"
    listed = tls.cli("-o", "json", "sites", "list", "--tenant", "root", BETTER_COMPUTE_CA_FILE=ca)
    assert listed.json()["items"] == []
    config = Path(tls.cli.env["XDG_CONFIG_HOME"]) / "better-compute" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[profiles.default]\nca_file = "{ca}"\n')
    assert tls.cli("whoami").out.split()[:2] == ["tenant:", "root"]
    config.unlink()


def test_m3_the_cli_without_the_ca_cannot_reach_it(tls: Tls, tmp_path: Path) -> None:
    """M3, M4: without the CA the certificate is not trusted: exit 3 (not reached), one line
    naming the certificate problem and the way out; a CA file that is not PEM is exit 2."""
    run = tls.cli("sites", "list", "--tenant", "root", code=3)
    assert run.err.startswith("error: cannot reach the control plane: https://127.0.0.1:")
    assert "CERTIFICATE_VERIFY_FAILED" in run.err and "--ca-file" in run.err
    assert len(run.err.strip().splitlines()) == 1
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    bad = tls.cli("--ca-file", str(not_pem), "whoami", code=2)
    assert bad.err.startswith(f"error: cannot load the CA file {not_pem}")


def test_m3_the_agent_client_joins_and_reports_over_https(tls: Tls) -> None:
    """M3: the agent's client with the CA file joins a pool, fetches its NodeSpec and reports;
    without it, the same join cannot reach the control plane (the agent retries)."""
    url, ca = tls.daemon.url, tls.certificates.ca
    with ControlPlane(url, token=tls.daemon.token, ca_file=ca) as root:
        site = root.call(
            "compute/sites/create",
            {"tenantId": "root", "name": "tls", "region": "eu", "kind": "shared"},
        )
        pool = root.call(
            "compute/pools/create",
            {"tenantId": "root", "siteId": site["id"], "class": "metal-host", "gpuModel": "H100"},
        )
        join = root.call("compute/joinTokens/create", {"tenantId": "root", "poolId": pool["id"]})
    inventory = recorded("dgx-h100-01")
    with ControlPlane(url) as untrusting, pytest.raises(Unreachable, match="CERTIFICATE_VERIFY"):
        untrusting.join(join["token"], inventory.hostname, inventory)
    with ControlPlane(url, ca_file=ca) as agent:
        node = agent.join(join["token"], inventory.hostname, inventory)
        spec = agent.spec(node["token"], node["nodeId"])
        units = [{"id": u["id"], "status": "applied"} for u in spec["units"]]
        applied = {"version": spec["version"], "units": units}
        assert agent.report(node["token"], node["nodeId"], inventory, applied)["specVersion"]


def test_m3_the_daemon_warns_of_plain_http_beyond_loopback(tls: Tls, tmp_path: Path) -> None:
    """M3: the TLS daemon logs an https URL and no warning; a daemon told to listen on every
    address without TLS says, as a warning, that tokens would cross the network in clear."""
    lines = [json.loads(line) for line in tls.daemon.log.read_text().splitlines()]
    serving = next(line for line in lines if line["event"] == "serving")
    assert serving["url"] == tls.daemon.url
    assert not [line for line in lines if line["level"] == "warning"]

    plain = Daemon(tmp_path)
    plain.extra = ("--listen", f"0.0.0.0:{plain.port}")  # the later --listen wins
    plain.start()
    try:
        plain.stop()
    finally:
        plain.kill()
    lines = [json.loads(line) for line in plain.log.read_text().splitlines()]
    (warning,) = [line for line in lines if line["level"] == "warning"]
    assert "plain HTTP" in warning["event"] and "--tls-cert" in warning["event"]
    assert warning["host"] == "0.0.0.0"
