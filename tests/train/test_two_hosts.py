"""Two hosts over TCP (issue 13): every other MPI test runs on shared memory inside one host.

Two network namespaces, joined by a veth pair (10.77.0.1 on "host" A, 10.77.0.2 on B, each end
named veth0), stand in for two machines: `mpirun` runs inside A and starts B's daemon through a
launcher agent (tests/train/netns_agent.sh, where ssh would be) that enters B's namespace. The
transport is forced to TCP on the veth: `--mca pml ob1 --mca btl tcp,self` with
`btl_tcp_if_include` and `oob_tcp_if_include` = veth0, so neither shared memory (vader, osc/sm)
nor loopback can carry a byte. Both namespaces share the file system, as cluster nodes share theirs.

One-sided MPI over TCP: Open MPI 4.1's osc/rdma needs an RDMA-capable btl, and TCP is not one,
so MPI_Win_allocate fails (MPI_ERR_WIN); osc/pt2pt emulates windows with point-to-point
messages and works, but Debian disables it (and osc/ucx, pml/ucx) in
/etc/openmpi/openmpi-mca-params.conf, so a TCP cluster needs `--mca osc pt2pt` for the rowwise
dispatch. The tests show both: the run with it follows the single process, the run without it
stops with one line saying what to add.

Needs root and iproute2 (`ip netns`): without them every test here is skipped with one line.
Run alone: /opt/moecore/venv/bin/python -m pytest -q tests/train/test_two_hosts.py
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_parallel import (EP_WEIGHT_TOL, MPI_ENV, STEPS, assert_follows_single_process, dp_config,
                           single, train_rows)  # noqa: F401 (single: a fixture)
from test_training_job import started, wait_for_logged_steps

AGENT = Path(__file__).resolve().parent / "netns_agent.sh"
HOST_A, HOST_B = "10.77.0.1", "10.77.0.2"
IFACE = "veth0"
# mpirun's options for the two hosts; `osc` is added per test (see the module's docstring).
TCP_ONLY = ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", IFACE, "--mca", "oob_tcp_if_include", IFACE]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespace_pids(ns: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]


class TwoHosts:
    def __init__(self, tag: str):
        # Unique per test session: other sessions may run this test on the same machine at once.
        self.ns_a, self.ns_b = f"{tag}A", f"{tag}B"

    def create(self) -> None:
        ip("netns", "add", self.ns_a)
        ip("netns", "add", self.ns_b)
        # Both ends named veth0 (one in each namespace), so one btl_tcp_if_include value names
        # the link on both hosts, as eth0 would on two real machines.
        ip("link", "add", IFACE, "netns", self.ns_a, "type", "veth", "peer", "name", IFACE,
           "netns", self.ns_b)
        for ns, addr in ((self.ns_a, HOST_A), (self.ns_b, HOST_B)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            ip("-n", ns, "link", "set", IFACE, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def destroy(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            for pid in namespace_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", ns, check=False)  # removes the veth pair with it

    def mpirun(self, bin_path: Path, config: Path, *sets: str, osc_pt2pt: bool = True) -> list:
        # One slot per host, mapped by node, and the map printed: rank 1 must be on host B.
        cmd = ["ip", "netns", "exec", self.ns_a, "mpirun", "--host", f"{HOST_A}:1,{HOST_B}:1",
               "-np", "2", "--map-by", "node", "--display-map",
               "--mca", "plm_rsh_agent", str(AGENT), *TCP_ONLY]
        if osc_pt2pt:
            cmd += ["--mca", "osc", "pt2pt"]
        cmd += [str(bin_path), "train", str(config)]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def env(self) -> dict:
        return {**MPI_ENV, "MOECORE_NETNS_HOSTS": f"{HOST_A}={self.ns_a},{HOST_B}={self.ns_b}"}

    def run(self, cmd: list, timeout: float = 240) -> subprocess.CompletedProcess:
        # stdin from /dev/null: mpirun forwards stdin to rank 0.
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=self.env())


@pytest.fixture(scope="module")
def hosts():
    if shutil.which("ip") is None:
        pytest.skip("two-host TCP test skipped: `ip` (iproute2) not installed")
    if shutil.which("mpirun") is None:
        pytest.skip("two-host TCP test skipped: mpirun not installed")
    h = TwoHosts(f"mc{os.getpid()}")
    try:
        h.create()
    except subprocess.CalledProcessError as e:
        h.destroy()
        reason = (e.stderr or "").strip().splitlines()[-1:] or ["failed"]
        pytest.skip(f"two-host TCP test skipped: `ip netns` not permitted here (needs root): "
                    f"{reason[0]}")
    try:
        # The link works before anything is blamed on MPI.
        probe = subprocess.run(["ip", "netns", "exec", h.ns_a, "ip", "route", "get", HOST_B],
                               capture_output=True, text=True, timeout=30)
        assert f"dev {IFACE}" in probe.stdout, probe.stdout + probe.stderr
        yield h
    finally:
        h.destroy()


def assert_ran_on_two_hosts(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # --display-map: one rank on each of two nodes, B by its address (A goes by the machine's
    # hostname, being mpirun's own), so every byte between the ranks crossed the veth.
    nodes = dict(re.findall(r"Data for node: (\S+)\s.*?Num procs: (\d+)", r.stdout))
    assert len(nodes) == 2 and nodes.get(HOST_B) == "1" and set(nodes.values()) == {"1"}, \
        r.stdout[:3000]


# `hosts` first: where namespaces are not permitted, the skip comes before any training.
def test_data_parallel_over_tcp_matches_single_process(hosts, moecore_bin, job_data, tmp_path,
                                                       single):
    cfg = dp_config(tmp_path, job_data, "dp")
    r = hosts.run(hosts.mpirun(moecore_bin, cfg))
    assert_ran_on_two_hosts(r)
    assert "dp=2 ep=1" in r.stdout
    assert_follows_single_process(single, tmp_path / "dp")


def test_rowwise_expert_parallel_over_tcp_matches_single_process(hosts, moecore_bin, job_data,
                                                                 tmp_path, single):
    """ep 2 with the one-sided row-wise dispatch: every MPI_Put/MPI_Get crosses the veth.
    capacity_factor = ep, so nothing is dropped and the run must equal the single process."""
    cfg = dp_config(tmp_path, job_data, "rowwise")
    r = hosts.run(hosts.mpirun(moecore_bin, cfg, "parallel.ep=2", "parallel.dispatch=rowwise",
                               "parallel.capacity_factor=2.0"))
    assert_ran_on_two_hosts(r)
    assert "dp=2 ep=2" in r.stdout and "rowwise dispatch" in r.stdout
    rows = train_rows(tmp_path / "rowwise")
    assert len(rows) == STEPS
    assert all(row["moe/drop_rate"] == 0.0 for row in rows.values())
    assert_follows_single_process(single, tmp_path / "rowwise", EP_WEIGHT_TOL)


def test_rowwise_without_a_one_sided_component_fails_in_one_line(hosts, moecore_bin, job_data,
                                                                  tmp_path):
    """Without osc/pt2pt (Debian's default set-up) no one-sided component serves TCP. Where one
    does (another MPI build), the run simply works; where none does, the job must stop at once
    with one line that names the window and the MCA setting to add, not hang or dump a trace."""
    cfg = dp_config(tmp_path, job_data, "no_osc", max_steps=2)
    r = hosts.run(hosts.mpirun(moecore_bin, cfg, "parallel.ep=2", "parallel.dispatch=rowwise",
                               osc_pt2pt=False), timeout=120)
    if r.returncode == 0:
        pytest.skip("this MPI has a one-sided component for TCP without --mca osc pt2pt")
    errors = [l for l in r.stderr.splitlines() if l.startswith("moecore: error")]
    assert errors, r.stderr[-2000:]
    assert "MPI_Win_allocate" in errors[0] and "--mca osc pt2pt" in errors[0], errors


def test_killing_the_other_host_ends_the_job(hosts, moecore_bin, job_data, tmp_path):
    """SIGKILL to every process of host B (its Open MPI daemon and its rank), as if the machine
    died: mpirun on host A must end the job, its own rank included, within 60 s."""
    out = tmp_path / "killed"
    cfg = dp_config(tmp_path, job_data, "killed", max_steps=100000, save_every=0)
    with open(tmp_path / "killed.log", "w+") as log:  # a file: nothing drains a pipe meanwhile
        cmd = hosts.mpirun(moecore_bin, cfg, "parallel.ep=2", "parallel.dispatch=rowwise",
                           "parallel.capacity_factor=2.0")
        with started(cmd, log, hosts.env()) as proc:
            wait_for_logged_steps(out, 3, proc)
            assert proc.poll() is None, "the job ended before host B could be killed"
            victims = namespace_pids(hosts.ns_b)
            assert len(victims) >= 2, victims  # orted and rank 1 at least
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            start = time.monotonic()
            rc = proc.wait(timeout=90)
            elapsed = time.monotonic() - start
        log.seek(0)
        text = log.read()
    print(f"two hosts: the job ended {elapsed:.1f} s after host B was killed (rc {rc})")
    assert rc != 0, text[-2000:]
    assert elapsed < 60, (elapsed, text[-2000:])
    # Nothing of the job survives on host A either (rank 0 would otherwise spin in a collective).
    deadline = time.monotonic() + 10
    while namespace_pids(hosts.ns_a) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert namespace_pids(hosts.ns_a) == [], "processes left on host A"
