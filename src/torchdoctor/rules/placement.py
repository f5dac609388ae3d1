"""Hardware layer, placement: a rank's CPUs far from its accelerator's NUMA node (HW-12).

On a host with several NUMA nodes, every host-to-device copy, pinned buffer and DataLoader batch
of a rank whose CPUs sit on another node than its accelerator crosses the socket interconnect.
Live facts only: the accelerator's NUMA node from sysfs (by its PCI address), the affinity mask's
CPUs per node. Not priced (the cost depends on the copy traffic, which the A/B of the affinity
remedy measures); on a host with one NUMA node nothing is raised.
"""

from __future__ import annotations

from torchdoctor.advice.command import job_command, started_by_torchrun, torchrun_with
from torchdoctor.hardware.topology import cpulist, near_cpus_per_rank

from ._common import View, finding, views
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix


def _peers(every: list[View], v: View) -> tuple[int, int]:
    """(local ranks whose accelerator is on v's node, v's index among them), by host and rank."""
    host = v.f.hostname if v.f is not None else None
    node = v.f.device.numa_node if v.f is not None else None
    same = sorted(x.rank or 0 for x in every
                  if x.f is not None and x.f.hostname == host and x.f.device.numa_node == node)
    return max(len(same), 1), same.index(v.rank or 0) if (v.rank or 0) in same else 0


@rule("HW-12")
def numa_placement(inputs: RuleInputs) -> list[Finding]:
    """The rank's affinity mask has no CPU on its accelerator's NUMA node (warning), or most of its
    CPUs elsewhere (info). Fix: torchrun --numa-binding=node where the running torch has it, else
    the exact CPU list per local rank (the node's CPUs split among the ranks on it)."""
    out = []
    every = views(inputs)
    for v in every:
        f = v.f
        if f is None or f.device.numa_node is None or len(f.cpu.affinity_numa) == 0:
            continue
        node, counts = f.device.numa_node, {int(k): n for k, n in f.cpu.affinity_numa.items()}
        if (f.cpu.numa_nodes or 1) < 2:
            continue
        near = counts.get(node, 0)
        total = sum(counts.values())
        if near * 2 >= total:
            continue
        ranks_on_node, index = _peers(every, v)
        cpus = near_cpus_per_rank(f.device.numa_node_cpus, ranks_on_node, index)
        where = ", ".join(f"node {k}: {n}" for k, n in sorted(counts.items()))
        # torchrun's flag, unless the job is known to start its ranks another way (spawn, accelerate).
        if f.cpu.numa_binding_available and started_by_torchrun(inputs.run) is not False:
            fix = Fix("Bind each rank to the CPUs of its accelerator's NUMA node with torchrun.",
                      torchrun_with(inputs.run, "--numa-binding=node",
                                    "torchrun --numa-binding=node --nproc-per-node=N train.py"), language="shell")
        else:
            fix = Fix(f"Pin rank {v.rank} to CPUs {cpulist(cpus)} (node {node}'s CPUs split among its "
                      f"{ranks_on_node} local rank(s)); "
                      + ("the job does not start its ranks with torchrun, whose --numa-binding would do it."
                         if f.cpu.numa_binding_available else "this torch's torchrun has no --numa-binding."),
                      f"os.sched_setaffinity(0, {{{', '.join(map(str, cpus[:16]))}{', ...' if len(cpus) > 16 else ''}}})"
                      if cpus else f"taskset -c <node {node} CPUs> {job_command(inputs.run)}")
        out.append(finding(
            v, "HW-12", "hardware",
            f"Rank {v.rank} runs on CPUs of NUMA node(s) {sorted(k for k, n in counts.items() if n)} while its "
            f"accelerator sits on node {node}" + (": every host-device copy crosses the interconnect." if not near
                                                  else f" ({near} of its {total} CPUs are near it)."),
            0.0, sev="warning" if not near else "info",
            evidence=[Evidence(f"Accelerator {f.device.pci_address} on NUMA node {node}; affinity mask by node: {where}.",
                               {"device_numa_node": node, "affinity_by_node": counts, "pci_address": f.device.pci_address,
                                "suggested_cpus": cpulist(cpus)})],
            fix=fix, confidence="high",
            confirm="the affinity remedy's A/B measures what the placement costs",
            source="sysfs numa_node of the accelerator vs sched_getaffinity; torchrun --numa-binding"))
    return out
