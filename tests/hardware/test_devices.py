"""hardware/devices: the device table's figures and sources, and matching a trace's device to it."""

from __future__ import annotations

import gzip
import json
import sys
from importlib import resources

import pytest

from real_traces import trace
from torchdoctor.hardware.devices import (
    FIGURES,
    from_trace_properties,
    identify,
    load_table,
    match_device,
    normalise_name,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

GIB = 2**30
REQUIRED = ("V100-SXM2", "A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB", "H100-SXM",
            "H100-PCIE", "H200-SXM", "B200", "L4", "L40S", "A10G", "RTX-4090", "MI250X", "MI300X")


def props(name: str, cc: tuple[int, int], sms: int, mem: int) -> dict:
    return {"name": name, "computeMajor": cc[0], "computeMinor": cc[1], "numSms": sms, "totalGlobalMem": mem}


def raw_table() -> dict:
    return tomllib.loads(resources.files("torchdoctor.hardware").joinpath("devices.toml").read_text("utf-8"))


def test_every_figure_has_a_known_source():
    doc = raw_table()
    sources = doc["sources"]
    n = 0
    for d in doc["devices"]:
        for f in _all_figs(d):
            assert isinstance(f, dict) and set(f) <= {"value", "source", "note"}, (d["key"], f)
            assert f["source"] in sources and sources[f["source"]].strip(), (d["key"], f)
            assert f["value"], (d["key"], f)
            n += 1
        numeric = {k for k, v in d.items() if isinstance(v, (int, float)) and k != "gcds"}
        assert not numeric, f"{d['key']}: figures without a source: {numeric}"
    assert n > 150
    assert all(s in {f["source"] for d in doc["devices"] for f in _all_figs(d)} for s in sources), "unused source"


def _all_figs(d: dict) -> list[dict]:
    return ([d[k] for k in FIGURES if k in d] + list(d.get("dense_tflops", {}).values())
            + list(d.get("sparse_tflops", {}).values()))


def test_table_covers_the_accelerators_people_train_on_and_is_consistent():
    entries, _, names = load_table()
    keys = {e.key for e in entries}
    assert set(REQUIRED) <= keys and len(keys) == len(entries)
    for e in entries:
        for prec, sparse in e.sparse_tflops.items():
            dense = e.dense_tflops.get(prec)
            # 2:4 sparsity doubles the rate; vendors round (L40S datasheet: 362.05 dense, 733 sparse).
            assert dense is None or abs(sparse / dense - 2) < 0.03, (e.key, prec)
        assert all(p in e.sources for p in (f"dense_tflops.{k}" for k in e.dense_tflops))
    # A listed name belongs to one entry, except ROCm's shared "MI250X/MI250" (properties decide).
    listed = [n for e in entries for n in names[e.key]]
    assert {n for n in listed if listed.count(n) > 1} == {"MI250X MI250"}


def test_normalise_name():
    assert normalise_name("NVIDIA A100-SXM4-80GB") == "A100 SXM4 80GB"
    assert normalise_name("Tesla V100-SXM2-32GB") == "V100 SXM2 32GB"
    assert normalise_name("AMD Instinct MI300X") == "MI300X"
    assert normalise_name("Intel(R) Data Center GPU Max 1550") == "DATA CENTER GPU MAX 1550"


@pytest.mark.parametrize(("file", "key", "scope"), [
    ("a100_alexnet_sync.json.gz", "A100-SXM4-40GB", ""),      # "NVIDIA A100-PG509-200", 42.3e9 B
    ("event_sync_multistream.json.gz", "A100-SXM4-40GB", ""),
    # "AMD Radeon Graphics", gfx90a, 104 CUs, 64 GB: an MI250 die, or an MI210 with the same figures.
    ("mi250_rocm_minitoy.json.gz", "MI250", "one of 2 GCDs or AMD Instinct MI210: the same figures"),
    ("v100_resnet_rank0.json.gz", "V100-SXM2", ""),           # "Tesla V100-SXM2-32GB"
])
def test_real_traces_match(file, key, scope):
    with gzip.open(trace(file), "rt") as f:
        doc = json.load(f)
    got = from_trace_properties(doc["deviceProperties"])
    assert got.device is not None, got.reason
    assert (got.device.key, got.device.scope) == (key, scope)


def test_the_deviceproperties_of_the_other_real_traces():
    # Copied from a100_16rank_rank0 and v100_2rank_rank1_diff (too large to parse for one header).
    a100 = identify(None, props("NVIDIA A100-SXM4-80GB", (8, 0), 108, 84_990_623_744)).device
    assert a100 is not None and a100.key == "A100-SXM4-80GB" and a100.mem_bw_gbs == 2039
    v100 = match_device(None, props("Tesla V100-SXM2-16GB", (7, 0), 80, 16_945_512_448))
    assert v100 is not None and v100.key == "V100-SXM2" and v100.peak_tflops("fp16") == 125
    assert v100.peak_tflops("bf16") is None  # Volta has no BF16: unknown, never borrowed from fp16


def test_mi250_gcd_is_half_the_module():
    gcd = match_device("AMD Radeon Graphics", props("AMD Radeon Graphics", (9, 0), 104, 68_702_699_520))
    whole = match_device("AMD Instinct MI250")
    assert gcd is not None and whole is not None
    assert gcd.sms == 104 and gcd.peak_tflops("fp16") == pytest.approx(whole.peak_tflops("fp16") / 2)
    assert gcd.mem_bw_gbs == pytest.approx(1638.4)
    # An MI250X GCD has 110 CUs; ROCm's shared name is settled by the CU count.
    x = match_device("AMD Instinct MI250X/MI250", props("AMD Instinct MI250X/MI250", (9, 0), 110, 64 * GIB))
    assert x is not None and x.key == "MI250X" and x.scope == "one of 2 GCDs"


@pytest.mark.parametrize(("name", "p", "key"), [
    ("NVIDIA H100 80GB HBM3", None, "H100-SXM"),
    ("NVIDIA H100 80GB HBM3", props("NVIDIA H100 80GB HBM3", (9, 0), 132, 81559 * 2**20), "H100-SXM"),
    ("NVIDIA H100 PCIe", None, "H100-PCIE"),
    ("NVIDIA H100 PCIe", props("NVIDIA H100 PCIe", (9, 0), 114, 81559 * 2**20), "H100-PCIE"),
    ("NVIDIA H200", None, "H200-SXM"),
    ("NVIDIA H200", props("NVIDIA H200", (9, 0), 132, 143771 * 2**20), "H200-SXM"),
    ("NVIDIA H100", props("NVIDIA H100", (9, 0), 132, 81559 * 2**20), "H100-SXM"),  # bare family + fingerprint
    ("NVIDIA B200", props("NVIDIA B200", (10, 0), 148, 183359 * 2**20), "B200"),
    ("NVIDIA L4", props("NVIDIA L4", (8, 9), 58, 23034 * 2**20), "L4"),
    ("NVIDIA L40S", None, "L40S"),
    ("NVIDIA A10G", None, "A10G"),
    ("NVIDIA GeForce RTX 4090", None, "RTX-4090"),
    ("AMD Instinct MI300X", props("AMD Instinct MI300X", (9, 4), 304, 192 * GIB), "MI300X"),
    # A cloud VM's SR-IOV function, as AMD-AGI/TraceLens's mi300 bert-small trace records it.
    ("AMD Instinct MI300X VF", props("AMD Instinct MI300X VF", (9, 4), 304, 205571227648), "MI300X"),
    ("NVIDIA A100 80GB PCIe", None, "A100-PCIE-80GB"),
    # deepseek-ai/profile-data's train.json (DeepSeek-V3 training) records these properties.
    ("NVIDIA H800", props("NVIDIA H800", (9, 0), 132, 84943110144), "H800-SXM"),
    # kineto's tb_plugin ResNet-50 samples were recorded on a DGX Station's V100s.
    ("Tesla V100-DGXS-32GB", props("Tesla V100-DGXS-32GB", (7, 0), 80, 34084028416), "V100-SXM2"),
])
def test_name_variants(name, p, key):
    got = identify(name, p)
    assert got.device is not None and got.device.key == key, got.reason


def test_hopper_peaks():
    sxm, h200 = match_device("NVIDIA H100 80GB HBM3"), match_device("NVIDIA H200")
    assert sxm is not None and h200 is not None
    assert sxm.peak_tflops("bf16") == 989.4 and sxm.peak_tflops("bf16", sparse=True) == 1979
    assert h200.peak_tflops("bf16") == sxm.peak_tflops("bf16") and h200.mem_bw_gbs == 4800 > sxm.mem_bw_gbs
    assert sxm.ridge_flop_per_byte("bf16") == pytest.approx(989.4e12 / 3350e9)
    assert "H100" in sxm.sources["dense_tflops.bf16"]
    # The H800 is the H100 SXM's die with NVLink and FP64 cut: same low-precision roofs.
    h800 = match_device("NVIDIA H800")
    assert h800 is not None and h800.peak_tflops("bf16") == sxm.peak_tflops("bf16")
    assert h800.mem_bw_gbs == sxm.mem_bw_gbs and h800.interconnect_gbs == 400 < sxm.interconnect_gbs


@pytest.mark.parametrize(("name", "p", "why"), [
    ("NVIDIA RTX 6000 Ada Generation", props("x", (8, 9), 142, 48 * GIB), "not in the device table"),
    ("Tesla V100-PCIE-32GB", None, "not in the device table"),  # a variant the table lacks: no neighbour
    ("NVIDIA H100", None, "could be"),  # a bare family name needs the properties
    ("NVIDIA A100", props("NVIDIA A100", (8, 0), 108, 40 * GIB), "could be"),  # SXM4 or PCIe 40GB
    ("NVIDIA H100 80GB HBM3", props("x", (9, 0), 66, 40 * GIB), "match no table entry"),  # e.g. a MIG slice
    ("NVIDIA H100 NVL", props("NVIDIA H100 NVL", (9, 0), 132, 95830 * 2**20), "not in the device table"),
    ("NVIDIA H800 PCIe", None, "not in the device table"),  # the PCIe part is not the SXM one
    ("", None, "could be"),
    ("AMD Radeon Graphics", props("AMD Radeon Graphics", (11, 0), 48, 24 * GIB), "match no table entry"),
])
def test_unknown_devices_give_none_and_a_reason(name, p, why):
    got = identify(name, p)
    assert got.device is None and why in got.reason and "no roofline" in got.reason


def test_no_device_properties():
    got = from_trace_properties([])
    assert got.device is None and "no roofline" in got.reason


def test_the_mi210_is_named_and_matches_an_mi250_die():
    """TraceLens' MI210 trace read 'unknown device': the card is one MI250 die on PCIe (AnandTech's table)."""
    mi210 = match_device("AMD Instinct MI210", props("AMD Instinct MI210", (9, 0), 104, 64 * GIB))
    assert mi210 is not None and mi210.key == "MI210" and mi210.scope == ""
    die = match_device("AMD Instinct MI250").one_die()
    assert mi210.peak_tflops("fp16") == 181 == pytest.approx(die.peak_tflops("fp16"), rel=0.01)
    assert mi210.mem_bw_gbs == die.mem_bw_gbs == pytest.approx(1638.4)
    assert "AnandTech" in mi210.sources["dense_tflops.fp16"]
