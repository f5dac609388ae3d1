"""`torchdoctor topo`: the host's NUMA nodes, accelerators and NICs, and this process's CPUs on them."""

from __future__ import annotations

import argparse
import json
import os

from torchdoctor.hardware import topology


def cmd_topo(args: argparse.Namespace) -> int:
    topo = topology.read(args.root)
    try:
        mask = sorted(os.sched_getaffinity(0)) if args.root == "/" else []
    except (AttributeError, OSError):
        mask = []
    where = topology.placement(topo, mask, None).cpu_nodes if mask else {}
    if args.json:
        print(json.dumps({**topo.to_dict(), "affinity": topology.cpulist(mask), "affinity_by_node": where}))
        return 0
    if not topo.nodes:
        print("NUMA: not visible (no /sys/devices/system/node): placement cannot be checked.")
    for n in topo.nodes:
        accels = [d.address for d in topo.accelerators if d.numa_node == n.node]
        nics = [f"{d.address} ({d.kind})" for d in topo.nics if d.numa_node == n.node]
        mem = f", {n.mem_mb:,} MB" if n.mem_mb else ""
        print(f"node {n.node}: CPUs {topology.cpulist(n.cpus)}{mem}; accelerators: {', '.join(accels) or '-'}; "
              f"NICs: {', '.join(nics) or '-'}")
    unplaced = [d for d in topo.accelerators + topo.nics if d.numa_node is None]
    if unplaced:
        print("NUMA node not reported by the firmware: " + ", ".join(d.address for d in unplaced))
    if mask:
        print(f"this process may run on CPUs {topology.cpulist(mask)}"
              + (f" (by node: {', '.join(f'node {k}: {v}' for k, v in sorted(where.items()))})" if where else ""))
    if len(topo.nodes) == 1:
        print("One NUMA node: every CPU is equally near every device; placement raises nothing.")
    return 0


def add_topo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("topo", help="print the host's NUMA nodes, accelerators and NICs (sysfs)",
                              description="The host's topology from sysfs (no root needed): NUMA nodes with their CPUs "
                                          "and memory, the accelerators and NICs on each, and this process's CPUs.")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)  # a sysfs tree elsewhere (tests)
    p.set_defaults(func=cmd_topo)
    return p
