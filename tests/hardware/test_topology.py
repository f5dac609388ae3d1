"""Host topology from a sysfs tree built here, `torchdoctor topo`, and the placement rule HW-12."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torchdoctor.facts import CpuFacts, DeviceFacts, RankFacts
from torchdoctor.hardware import topology
from torchdoctor.rules import RankInputs, RuleInputs, diagnose

GPU = "0000:17:00.0"


def sysfs(root: Path, nodes: dict[int, str], gpu_node: int = 1) -> Path:
    """A two-socket host: NUMA nodes with CPU lists, one NVIDIA GPU and an IB NIC on ``gpu_node``."""
    for n, cpus in nodes.items():
        d = root / f"sys/devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {n} MemTotal:       65536000 kB\n")
    dev = root / "sys/bus/pci/devices" / GPU
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x030200\n")
    (dev / "vendor").write_text("0x10de\n")
    (dev / "numa_node").write_text(f"{gpu_node}\n")
    ib = root / "sys/class/infiniband/mlx5_0/device"
    ib.mkdir(parents=True)
    (ib / "numa_node").write_text(f"{gpu_node}\n")
    eth = root / "sys/class/net/eth0/device"
    eth.mkdir(parents=True)
    (eth / "numa_node").write_text("-1\n")
    (root / "sys/class/net/lo").mkdir(parents=True)  # virtual: no device, not a NIC
    return root


def test_cpulists_round_trip():
    assert topology.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert topology.cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert topology.parse_cpulist("junk,2") == [2]


def test_read_finds_nodes_devices_and_nics_on_them(tmp_path):
    topo = topology.read(str(sysfs(tmp_path, {0: "0-3", 1: "4-7"})))
    assert [(n.node, n.cpus, n.mem_mb) for n in topo.nodes] == [(0, [0, 1, 2, 3], 64000), (1, [4, 5, 6, 7], 64000)]
    assert [(d.address, d.kind, d.numa_node) for d in topo.accelerators] == [(GPU, "nvidia", 1)]
    assert [(d.address, d.kind, d.numa_node) for d in topo.nics] == [("mlx5_0", "ib", 1), ("eth0", "eth", None)]
    where = topology.placement(topo, [0, 1, 2, 3], topology.numa_of(topo, GPU.upper()))
    assert where.far and where.cpu_nodes == {0: 4} and where.near_cpus == [4, 5, 6, 7]


def rank(r: int, affinity: list[int], topo: topology.Topology, binding: bool = False) -> RankInputs:
    node = topology.numa_of(topo, GPU)
    where = topology.placement(topo, affinity, node)
    facts = RankFacts(
        rank=r, hostname="h1", world_size=2,
        device=DeviceFacts(kind="cuda", name="NVIDIA A100", pci_address=GPU, numa_node=node, numa_node_cpus=where.near_cpus),
        cpu=CpuFacts(affinity=affinity, numa_nodes=len(topo.nodes), numa_binding_available=binding,
                     affinity_numa={str(k): v for k, v in where.cpu_nodes.items()}))
    return RankInputs(r, facts=facts)


def test_a_rank_pinned_to_the_other_node_is_told_its_exact_cpus(tmp_path):
    topo = topology.read(str(sysfs(tmp_path, {0: "0-3", 1: "4-7"})))
    findings, _ = diagnose(RuleInputs(ranks=[rank(0, [0, 1], topo), rank(1, [2, 3], topo)]))
    got = sorted((f for f in findings if f.id == "HW-12"), key=lambda f: f.ranks)
    assert [f.severity for f in got] == ["warning", "warning"]
    assert "accelerator sits on node 1" in got[0].title and "interconnect" in got[0].title
    # Both ranks' accelerators are on node 1 (one GPU address in this tree): its 4 CPUs, 2 each.
    assert "CPUs 4-5" in got[0].fix.text and "CPUs 6-7" in got[1].fix.text
    with_binding, _ = diagnose(RuleInputs(ranks=[rank(0, [0, 1], topo, binding=True)]))
    assert "--numa-binding=node" in next(f for f in with_binding if f.id == "HW-12").fix.snippet


def test_near_ranks_and_single_node_hosts_raise_nothing(tmp_path):
    topo = topology.read(str(sysfs(tmp_path / "a", {0: "0-3", 1: "4-7"})))
    findings, _ = diagnose(RuleInputs(ranks=[rank(0, [4, 5, 6, 7], topo)]))
    assert not [f for f in findings if f.id == "HW-12"]
    one = topology.read(str(sysfs(tmp_path / "b", {0: "0-7"}, gpu_node=0)))
    findings, _ = diagnose(RuleInputs(ranks=[rank(0, [0, 1], one)]))
    assert not [f for f in findings if f.id == "HW-12"]


def test_topo_command_prints_the_map(tmp_path):
    root = sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    out = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "topo", "--root", str(root)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"node 1: CPUs 4-7, 64,000 MB; accelerators: {GPU}; NICs: mlx5_0 (ib)" in out.stdout
    assert "not reported by the firmware: eth0" in out.stdout
    js = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "topo", "--root", str(root), "--json"],
                        capture_output=True, text=True, timeout=60)
    assert json.loads(js.stdout)["accelerators"] == [{"address": GPU, "kind": "nvidia", "numa_node": 1}]
