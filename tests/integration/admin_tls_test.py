#!/usr/bin/env python3
"""TLS and mutual TLS on the TCP admin listener (admin_tls), with
certificates made here by openssl: packfeedctl with the CA (and, under
mutual TLS, a client certificate) is answered; plaintext, another CA, or no
client certificate under mutual TLS is refused. A rank attaching over the
same listener (ranks_over_tcp) is served with those credentials and refused
without its certificate under mutual TLS. Two daemons checking each other as
peers over mutual TLS both start.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import json
import pathlib
import subprocess
import tempfile

from daemon_harness import Daemon, free_port, wait_until

TOKEN = "admin-s3cret"
JOB_TOKEN = "job-s3cret"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(work, name):
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = work / name
    d.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", f"/CN={name} test CA", cwd=d)
    for who, extension in [("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                           ("client", "extendedKeyUsage=clientAuth")]:
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out",
                f"{who}.csr", "-subj", f"/CN=packfeed {who}", cwd=d)
        (d / f"{who}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext",
                cwd=d)
    return d


def config(prefix, port, pki, mutual, local_ranks, peers=()):
    peer_lines = "".join(f'peers: "{p}"\n' for p in peers)
    ranks = " ".join(f"local_ranks: {r}" for r in local_ranks)
    return f"""admin_tcp_address: "127.0.0.1:{port}"
admin_tcp_token: "{TOKEN}"
ranks_over_tcp: true
{peer_lines}peer_timeout_seconds: 30
admin_tls {{ cert_file: "{pki}/server.pem" key_file: "{pki}/server.key"
            ca_file: "{pki}/ca.pem" mutual: {str(mutual).lower()} }}
jobs {{
  name: "job"
  datasets {{ prefix: "{prefix}" }}
  topology {{ dp: 2 }}
  global_batch: 8
  seq_length: 512
  eod_id: 1000
  append_eod: true
  auth_token: "{JOB_TOKEN}"
  {ranks}
  scheduler {{ kind: "balanced" max_tokens_per_rank: 1024 }}
}}
"""


def test_admin_api_over_tls(bin_dir, checks):
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        pki, other = make_pki(work, "cluster"), make_pki(work, "other")
        checks.run("make-dataset", "--out", str(work / "data"), "--count", "50",
                   "--min", "16", "--max", "300", "--mean", "100", "--vocab", "1000")

        def health(daemon, port, *tls):
            return daemon.ctl_run("health", "--address", f"127.0.0.1:{port}",
                                  "--admin-token", TOKEN, *tls)

        for mutual in (False, True):
            port = free_port()
            text = config(work / "data", port, pki, mutual, [0, 1])
            kind = "mutual TLS" if mutual else "TLS"
            with Daemon(bin_dir, text, name=f"tls{int(mutual)}", workdir=work) as daemon:
                client_cert = ["--tls-cert", f"{pki}/client.pem", "--tls-key", f"{pki}/client.key"]
                ok = health(daemon, port, "--tls-ca", f"{pki}/ca.pem", *client_cert)
                checks.check(f"{kind}: the CA and a client certificate are answered",
                             ok.returncode == 0, ok.stderr)
                print(f"{kind}: {ok.stdout.strip()}")
                refused = {
                    "plaintext": health(daemon, port),
                    "another CA": health(daemon, port, "--tls-ca", f"{other}/ca.pem"),
                }
                without_cert = health(daemon, port, "--tls-ca", f"{pki}/ca.pem")
                if mutual:
                    refused["no client certificate"] = without_cert
                    refused["a client certificate of another CA"] = health(
                        daemon, port, "--tls-ca", f"{pki}/ca.pem", "--tls-cert",
                        f"{other}/client.pem", "--tls-key", f"{other}/client.key")
                else:
                    checks.check("TLS: the CA alone is answered", without_cert.returncode == 0,
                                 without_cert.stderr)
                # A rank on a node without a daemon attaches over the same
                # listener, with the same credentials, and is served.
                rank = daemon.ctl_run("dump", "--address", f"127.0.0.1:{port}", "--job", "job",
                                      "--rank", "1", "--token", JOB_TOKEN, "--ucx-transports",
                                      "tcp", "--json", "--tls-ca", f"{pki}/ca.pem", *client_cert)
                checks.check(f"{kind}: a rank attaches over TCP and is served",
                             rank.returncode == 0 and json.loads(rank.stdout)["rank"] == 1,
                             rank.stderr)
                if mutual:
                    stranger = daemon.ctl_run("dump", "--address", f"127.0.0.1:{port}", "--job",
                                              "job", "--rank", "1", "--token", JOB_TOKEN,
                                              "--tls-ca", f"{pki}/ca.pem")
                    checks.check(f"{kind}: a rank without a client certificate is refused",
                                 stranger.returncode != 0 and "UNAVAILABLE" in stranger.stderr,
                                 stranger.stderr)
                for name, result in refused.items():
                    # gRPC reports a failed handshake as a connection that
                    # cannot be made: UNAVAILABLE, naming the call and where.
                    checks.check(f"{kind}: {name} is refused, naming the call and the address",
                                 result.returncode != 0 and "UNAVAILABLE: health (127.0.0.1:"
                                 f"{port})" in result.stderr, result.stderr or result.stdout)
                    print(f"  {name}: {result.stderr.strip().splitlines()[-1][:150]}")

        # Two daemons with disjoint ranks check each other over mutual TLS.
        port_a, port_b = free_port(), free_port()
        a = Daemon(bin_dir, config(work / "data", port_a, pki, True, [0], [f"127.0.0.1:{port_b}"]),
                   name="peer_a", workdir=work)
        b = Daemon(bin_dir, config(work / "data", port_b, pki, True, [1], [f"127.0.0.1:{port_a}"]),
                   name="peer_b", workdir=work)
        a.start(wait=False)  # it waits for b to answer its check
        with b:
            took = wait_until(lambda: a.ctl_run("health").returncode == 0,
                              "the first daemon passed its peer check", timeout=30)
            checks.check("peers over mutual TLS both serve", b.ctl_run("health").returncode == 0)
            print(f"peers over mutual TLS: both daemons serve ({took:.1f} s after the second)")
        a.stop()
