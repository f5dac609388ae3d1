"""The host's topology from sysfs: NUMA nodes, accelerators and NICs on them, and where a rank sits.

Everything is read from files any user may read (no root, no NVML needed), under a root
directory so that tests build a topology in a temporary tree:

  /sys/devices/system/node/nodeN/cpulist    CPUs of NUMA node N ("0-15,32-47")
  /sys/devices/system/node/nodeN/meminfo    "Node N MemTotal:  263842428 kB"
  /sys/bus/pci/devices/ADDR/{class,vendor,numa_node}
                                            accelerators: class 0x0302xx (3D controller) or
                                            0x0300xx (VGA) from NVIDIA 0x10de / AMD 0x1002, and
                                            0x1200xx (processing accelerators: Gaudi, MI300's)
  /sys/class/net/IF/device/numa_node        NICs; /sys/class/infiniband/DEV/device/numa_node

``numa_node`` is -1 where the firmware does not say: unknown, never guessed. No torch import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel", "0x1da3": "habana"}
_ACCEL_CLASSES = ("0x0302", "0x0300", "0x1200")


def parse_cpulist(text: str) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]; malformed parts are skipped."""
    out: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            out.extend(range(lo, min(hi, lo + 65536) + 1))
    return sorted(set(out))


def cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8"."""
    parts, run = [], []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@dataclass
class Node:
    node: int
    cpus: list[int]
    mem_mb: int | None = None


@dataclass
class Device:
    """A PCI device on the topology: an accelerator or a NIC."""

    address: str  # PCI address ("0000:17:00.0") or interface name for NICs
    kind: str  # "nvidia", "amd", ... for accelerators; "ib", "eth" for NICs
    numa_node: int | None  # None: the firmware does not say (-1)


@dataclass
class Topology:
    nodes: list[Node] = field(default_factory=list)
    accelerators: list[Device] = field(default_factory=list)
    nics: list[Device] = field(default_factory=list)

    def node_of_cpu(self) -> dict[int, int]:
        return {c: n.node for n in self.nodes for c in n.cpus}

    def to_dict(self) -> dict:
        return {"numa_nodes": [{"node": n.node, "cpus": cpulist(n.cpus), "mem_mb": n.mem_mb} for n in self.nodes],
                "accelerators": [vars(d) for d in self.accelerators], "nics": [vars(d) for d in self.nics]}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


def _numa(path: str) -> int | None:
    text = _read(path)
    try:
        n = int(text.strip()) if text else -1
    except ValueError:
        return None
    return n if n >= 0 else None


def read(root: str = "/") -> Topology:
    """The topology under ``root`` (``/`` on a real host)."""
    topo = Topology()
    node_dir = os.path.join(root, "sys/devices/system/node")
    for name in sorted(os.listdir(node_dir) if os.path.isdir(node_dir) else [], key=lambda s: (len(s), s)):
        m = re.fullmatch(r"node(\d+)", name)
        if not m:
            continue
        cpus = parse_cpulist(_read(os.path.join(node_dir, name, "cpulist")) or "")
        mem = re.search(r"MemTotal:\s+(\d+)\s*kB", _read(os.path.join(node_dir, name, "meminfo")) or "")
        topo.nodes.append(Node(int(m.group(1)), cpus, int(mem.group(1)) // 1024 if mem else None))
    pci = os.path.join(root, "sys/bus/pci/devices")
    for addr in sorted(os.listdir(pci) if os.path.isdir(pci) else []):
        cls = (_read(os.path.join(pci, addr, "class")) or "").strip()
        vendor = (_read(os.path.join(pci, addr, "vendor")) or "").strip()
        if cls.startswith(_ACCEL_CLASSES) and vendor in VENDORS and not (cls.startswith("0x0300") and vendor == "0x8086"):
            topo.accelerators.append(Device(addr, VENDORS[vendor], _numa(os.path.join(pci, addr, "numa_node"))))
    for base, kind in (("sys/class/infiniband", "ib"), ("sys/class/net", "eth")):
        d = os.path.join(root, base)
        for name in sorted(os.listdir(d) if os.path.isdir(d) else []):
            if os.path.exists(os.path.join(d, name, "device")):  # virtual interfaces have no device
                topo.nics.append(Device(name, kind, _numa(os.path.join(d, name, "device", "numa_node"))))
    return topo


def pci_address(domain: int, bus: int, device: int) -> str:
    """sysfs's spelling of a PCI address (function 0): "0000:17:00.0"."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def numa_of(topo: Topology, address: str | None) -> int | None:
    """The NUMA node of an accelerator by PCI address (case-insensitive), None when unknown."""
    if not address:
        return None
    return next((d.numa_node for d in topo.accelerators if d.address.lower() == address.lower()), None)


@dataclass
class Placement:
    """Where a rank's CPUs are against its accelerator's NUMA node."""

    device_node: int | None
    cpu_nodes: dict[int, int]  # NUMA node -> CPUs of the rank's affinity mask on it
    near_cpus: list[int]  # the CPUs of the accelerator's node

    @property
    def far(self) -> bool:
        """No CPU of the mask on the accelerator's node (all memory traffic crosses the interconnect)."""
        return self.device_node is not None and bool(self.cpu_nodes) and self.cpu_nodes.get(self.device_node, 0) == 0

    @property
    def near_share(self) -> float | None:
        total = sum(self.cpu_nodes.values())
        return self.cpu_nodes.get(self.device_node, 0) / total if total and self.device_node is not None else None


def placement(topo: Topology, affinity: list[int], device_node: int | None) -> Placement:
    of = topo.node_of_cpu()
    counts: dict[int, int] = {}
    for c in affinity:
        if c in of:
            counts[of[c]] = counts.get(of[c], 0) + 1
    near = next((n.cpus for n in topo.nodes if n.node == device_node), [])
    return Placement(device_node, counts, near)


def near_cpus_per_rank(near: list[int], local_ranks_on_node: int, index: int) -> list[int]:
    """An even split of a NUMA node's CPUs among the local ranks whose accelerators sit on it."""
    if not near or local_ranks_on_node < 1:
        return []
    size = max(1, len(near) // local_ranks_on_node)
    return near[index * size:(index + 1) * size] or near[-size:]
