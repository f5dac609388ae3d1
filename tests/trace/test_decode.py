from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from kineto_builder import TraceBuilder
from torchdoctor.trace import decode
from torchdoctor.trace.decode import TraceFormatError
from torchdoctor.trace.load import load_trace
from torchdoctor.trace.model import Cat


def sample() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, 100.0, 1000.0)
    b.op("aten::mm", 110.25, 20.5)
    b.kernel("ampere_sgemm_128x64_nn", 140.001, 0.4, launch_at=120.0)  # sub-µs kernel: 400 ns
    b.kernel("void at::native::vectorized_elementwise_kernel<4>", 141.0, 0.0, launch_at=126.0)  # zero length
    return b


def columns(tr):
    return {k: getattr(tr, k).tolist() for k in ("cat", "name", "ts", "end", "pid", "tid", "stream", "correlation")}


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
@pytest.mark.parametrize("as_list", [False, True])
def test_dict_list_json_gz_decode_the_same(tmp_path, suffix, as_list):
    ref = load_trace(str(sample().write(tmp_path / "ref.json")))
    tr = load_trace(str(sample().write(tmp_path / f"t{suffix}", as_list=as_list)))
    assert columns(tr) == columns(ref)
    assert len(tr) == 6


def test_nanosecond_precision_no_rounding(tmp_path):
    tr = load_trace(str(sample().write(tmp_path / "t.json")))
    k = np.flatnonzero(tr.mask(Cat.KERNEL))
    assert tr.ts[k].tolist() == [140_001, 141_000]
    assert (tr.end[k] - tr.ts[k]).tolist() == [400, 0]
    assert (tr.dur >= 0).all()


def test_epoch_scale_timestamps_keep_nanoseconds(tmp_path):
    # 19 significant digits: a float64 cannot hold them, the exact path must read the text.
    b = TraceBuilder()
    b.op("aten::add", 111.0, 0.003)
    b.kernel("k", 333.0, 1.5, launch_at=222.0)
    text = json.dumps(b.document())
    for mark, exact in (("111.0", "1712195495519689.047"), ("222.0", "1712195495519690.001"),
                        ("333.0", "1712195495519695.812")):
        text = text.replace(f'"ts": {mark}', f'"ts": {exact}')
    path = tmp_path / "t.json"
    path.write_text(text)
    tr = load_trace(str(path))
    assert sorted(tr.ts.tolist()) == [1712195495519689047, 1712195495519690001, 1712195495519695812]
    assert sorted(tr.dur.tolist()) == [3, 1500, 5000]


def test_vectorised_exact_timestamps_match_the_one_by_one_parse():
    """raw_ts_to_ns (numpy string functions) gives _raw_to_ns's ns for every text, and reads a
    value outside int64 as missing (one by one it raised OverflowError)."""
    import random

    import msgspec

    texts = [b"5611579153203.755", b"1712195495519689.047", b"0", b"12", b"1.5", b"1.9999", b"1.99949",
             b"7.0005", b"-3.25", b"1e3", b"1.5E3", b"", b"1.", b".5", b"1.2.3", b" 1.5", b"1.2345678",
             b"9223372036854775.807", b"9223372036854775.808", b"99999999999999999.9999",
             b"123456789012345678.123", b"0000000000000000001.5", b"1" * 45]
    rnd = random.Random(0)
    for _ in range(5000):
        whole = str(rnd.randrange(0, 10 ** rnd.randrange(1, 19)))
        decimals = "".join(rnd.choice("0123456789") for _ in range(rnd.randrange(0, 7)))
        texts.append((whole + ("." + decimals if rnd.random() < 0.8 else "")).encode())
    raws = [msgspec.Raw(t) for t in texts]

    def one(raw):
        ns = decode._raw_to_ns(raw)
        return ns if -(2**63) < ns < 2**63 else decode._MISSING_NS

    got = decode.raw_ts_to_ns(raws)
    assert got.tolist() == [one(r) for r in raws]
    assert got[0] == 5611579153203755 and got[6] == 1_999 and got[5] == 2_000  # the 4th decimal rounds
    assert got[17] == 2**63 - 1
    assert got[18] == decode._MISSING_NS  # 9223372036854775808 ns: past int64
    # One shape for all (a trace's timestamps): the digit-matrix path, and its way out when one
    # text differs in sign, exponent or place of the point.
    for odd in (None, b"-712195495519689.047", b"1712195495519689e047", b"17121954955196.89047"):
        same = [b"17121954955196%02d.%03d" % (i % 100, (7 * i) % 1000) for i in range(200)]
        if odd is not None:
            same[57] = odd
        raws = [msgspec.Raw(t) for t in same]
        assert decode.raw_ts_to_ns(raws).tolist() == [one(r) for r in raws]


def test_integer_epoch_microseconds_scale_exactly(tmp_path):
    b = TraceBuilder()
    b.op("aten::add", 1661203462598738, 19)
    tr = load_trace(str(b.write(tmp_path / "t.json")))
    assert tr.ts.tolist() == [1661203462598738000]
    assert tr.end.tolist() == [1661203462598757000]


def test_block_boundaries_do_not_change_the_result(tmp_path, monkeypatch):
    b = TraceBuilder()
    # Names that look like event boundaries inside strings must not fool the cutter.
    tricky = ['void f<{lambda()#1}>(x)}, {"ph": "X"', "a}, {b", 'q"}, {"', "\\\"}, {"]
    for i in range(400):
        b.op(tricky[i % len(tricky)] + str(i), 10.0 * i, 5.0)
        b.kernel("k{}, {" + str(i), 10.0 * i + 1, 2.0, launch_at=10.0 * i)
    path = b.write(tmp_path / "t.json", compact=True)
    ref = load_trace(str(path))
    for block in (64, 257, 1000, 4096):
        monkeypatch.setattr(decode, "BLOCK_BYTES", block)
        assert columns(load_trace(str(path))) == columns(ref)
    assert len(ref) == 1200
    assert sum(n.startswith("a}, {b") for n in ref.names) == 100


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_a_small_trace_is_decoded_in_a_buffer_of_its_own_size(tmp_path, name):
    """The events' buffer holds what is left of the file, not two blocks: zeroing 32 MiB for every
    1.6 MB rank was 8,600 page faults each, 9.9 s of system time in 13.8 s at 512 ranks. What stays is
    the first read's one block (CPython sizes a read's result before it reads). A gzip stream's size
    is unknown until a read comes back short: then nothing is left."""
    import tracemalloc

    b = TraceBuilder()
    for i in range(3000):
        b.op(f"aten::op{i % 7}", 10.0 * i, 5.0)
    path = b.write(tmp_path / "t.json")
    if name.endswith(".gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress((tmp_path / "t.json").read_bytes()))
    size = (tmp_path / "t.json").stat().st_size
    assert 100_000 < size < 1_000_000
    ref = load_trace(str(path))
    tracemalloc.start()
    try:
        tr = load_trace(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert columns(tr) == columns(ref) and len(tr) == 3000
    assert peak < decode.BLOCK_BYTES + 4 * size, peak


def test_a_trace_whose_events_end_exactly_at_a_block_is_read_whole(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(50):
        b.op(f"aten::op{i}", 10.0 * i, 5.0)
    path = b.write(tmp_path / "t.json", compact=True)
    ref = columns(load_trace(str(path)))
    size = path.stat().st_size
    for block in (size - 1, size, size + 1, size // 2, size // 2 + 1):
        monkeypatch.setattr(decode, "BLOCK_BYTES", block)
        assert columns(load_trace(str(path))) == ref, block


def test_keys_after_trace_events_are_read(tmp_path, monkeypatch):
    doc = sample().document()
    evs = doc.pop("traceEvents")
    doc = {"traceEvents": evs, "deviceProperties": [{"name": "X1"}, {"name": "X2"}], "distributedInfo": {"rank": 5}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(decode, "BLOCK_BYTES", 128)
    tr = load_trace(str(path))
    assert tr.rank == 5 and tr.device_name == "X1" and len(tr) == 6


@pytest.mark.parametrize("block", [128, 1 << 20])
def test_keys_after_trace_events_survive_a_badly_typed_event_in_the_last_block(tmp_path, monkeypatch, block):
    # ROCm traces write hipMemcpyWithStream's "bytes" as a string; that event in the last block
    # sent the tail to the lenient path, which dropped the keys after the array (found on
    # AMD-AGI/TraceLens's mi300 bert-small trace: "unknown device", rank from the file name).
    doc = sample().document()
    evs = doc.pop("traceEvents")
    last = max(i for i, e in enumerate(evs) if e.get("ph") == "X")
    evs[last]["args"] = {"bytes": "1", "stream": 7}
    evs.append(evs.pop(last))  # the very last event: in the tail whatever the block size
    doc = {"traceEvents": evs, "deviceProperties": [{"name": "AMD Instinct MI300X VF"}],
           "distributedInfo": {"rank": 3, "world_size": 4}}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(decode, "BLOCK_BYTES", block)
    tr = load_trace(str(path))
    assert (tr.rank, tr.rank_source, tr.world_size) == (3, "distributedInfo", 4)
    assert tr.device_name == "AMD Instinct MI300X VF" and len(tr) == 6
    assert sorted(tr.stream.tolist())[-1] == 7 and 1 not in tr.nbytes.tolist()  # the bad field read as absent


def test_one_oddly_shaped_header_key_does_not_cost_the_others(tmp_path):
    doc = sample().document()
    evs = doc.pop("traceEvents")
    doc = {"deviceProperties": [{"name": "X1"}, 5], "distributedInfo": {"rank": 2}, "traceEvents": evs}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    assert (tr.rank, tr.device_name, len(tr)) == (2, "X1", 6)


def test_old_2021_schema_categories(tmp_path):
    evs = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "Kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
         "args": {"stream": 7, "correlation": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 60,
         "dur": 10, "args": {"stream": 7}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 80, "dur": 1,
         "args": {"stream": 7}},
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    tr = load_trace(str(path))
    assert tr.cat.tolist() == [Cat.CPU_OP, Cat.RUNTIME, Cat.KERNEL, Cat.MEMCPY, Cat.MEMSET]


@pytest.mark.parametrize("where", ["before", "after"])
def test_old_compute_properties_name_the_device(tmp_path, where):
    # Kineto before mid-2021 wrote `computeProperties` with cudaDeviceProp's field names (pytorch/kineto
    # tb_plugin's gpu_metrics_input_v1.json): the device is named and fingerprinted from them.
    old = [{"id": 0, "name": "Tesla V100-DGXS-32GB", "totalGlobalMem": 34084028416, "major": 7, "minor": 0,
            "multiProcessorCount": 80, "maxThreadsPerMultiProcessor": 2048}]
    evs = sample().document()["traceEvents"]
    doc = {"computeProperties": old, "traceEvents": evs} if where == "before" else \
        {"traceEvents": evs, "computeProperties": old}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    assert tr.device_name == "Tesla V100-DGXS-32GB"
    assert tr.device_properties == [{"id": 0, "name": "Tesla V100-DGXS-32GB", "totalGlobalMem": 34084028416,
                                     "computeMajor": 7, "computeMinor": 0, "numSms": 80,
                                     "maxThreadsPerMultiprocessor": 2048}]


def test_bad_fields_are_dropped_or_clipped_with_a_warning(tmp_path):
    doc = sample().document()
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "neg_dur", "pid": 1, "tid": 1, "ts": 500, "dur": -4},
        {"ph": "X", "cat": "cpu_op", "name": "huge_dur", "pid": 1, "tid": 1, "ts": 500, "dur": 1e300},
        {"ph": "X", "cat": "cpu_op", "name": "neg_ts", "pid": 1, "tid": 1, "ts": -5, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "str_ts", "pid": 1, "tid": 1, "ts": "600.5", "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "obj_ts", "pid": 1, "tid": 1, "ts": {"x": 1}, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "huge_id", "pid": 0, "tid": 7, "ts": 700, "dur": 1,
         "args": {"stream": 7, "correlation": 2**70}},
        ["not", "an", "event"],
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    names = set(tr.names[i] for i in tr.name)
    assert {"neg_dur", "str_ts", "huge_id"} <= names
    assert not {"no_ts", "huge_dur", "neg_ts", "obj_ts"} & names
    neg = tr.name == tr.names.index("neg_dur")
    assert tr.dur[neg].tolist() == [0]
    text = " | ".join(tr.warnings)
    assert "negative dur clipped" in text and "huge dur" in text and "missing or non-numeric" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"   \n", "empty file"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts"', "ends in the middle"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}} ]}', "invalid JSON"),
        (b'{"schemaVersion": 1, "deviceProperties": []}', "no traceEvents"),
        (b'{"traceEvents": 5}', "traceEvents is not a list"),
        (b'{"traceEvents": []}', "no complete"),
        # What torch.profiler writes when it recorded nothing: metadata and its window-end instant.
        (b'{"traceEvents": [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "t"}},'
         b' {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 5}]}',
         "no complete ('X') events: the profiler recorded no activity"),
        (b"hello", "not JSON"),
    ],
)
def test_unreadable_files_raise_one_line_reasons(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(path))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_truncated_gzip(tmp_path):
    path = sample().write(tmp_path / "t.json.gz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated gzip"):
        load_trace(str(path))


def test_invalid_json_deep_in_a_large_file_names_the_position(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(300):
        b.op(f"op{i}", i, 1)
    text = json.dumps(b.document())
    cut = text.index('"op200"')
    text = text[:cut] + "@" + text[cut + 1:]
    path = tmp_path / "t.json"
    path.write_text(text)
    monkeypatch.setattr(decode, "BLOCK_BYTES", 512)
    with pytest.raises(TraceFormatError, match=r"invalid JSON.*byte \d+"):
        load_trace(str(path))


def test_gzip_detected_by_content_not_name(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(gzip.compress(json.dumps(sample().document()).encode()))
    assert len(load_trace(str(path))) == 6


@pytest.mark.parametrize("as_list", [False, True])
def test_parallel_byte_ranges_match_sequential(tmp_path, monkeypatch, as_list):
    from torchdoctor.trace import parallel

    b = TraceBuilder()
    b.op("Spans-like", 1, 1, tid=0)
    for i in range(3000):
        b.op(f"op}}, {{{i % 7}", 10.0 * i, 5.0)
        b.kernel(f"kernel{i % 13}", 10.0 * i + 1, 2.0, launch_at=10.0 * i)
    doc = b.document(as_list)
    evs = doc if as_list else doc["traceEvents"]
    evs.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                "tid": "PyTorch Profiler", "ts": 0, "dur": 30000})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    ref = load_trace(str(path))
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "PROBE_BYTES", 4096)
    monkeypatch.setattr(decode, "BLOCK_BYTES", 20_000)
    for jobs in (2, 3):
        got = load_trace(str(path), jobs=jobs)
        assert got.names == ref.names or sorted(got.names) == sorted(ref.names)
        named = [[got.names[i] for i in got.name], [ref.names[i] for i in ref.name]]
        assert named[0] == named[1]
        for col in ("cat", "ts", "end", "stream", "correlation"):
            assert getattr(got, col).tolist() == getattr(ref, col).tolist(), col
        spans = got.pid < 0
        assert [got.names[-1 - p] for p in got.pid[spans]] == ["Spans"]


def test_unknown_accelerator_categories_degrade_gracefully(tmp_path):
    doc = sample().document()
    doc["traceEvents"] += [
        {"ph": "X", "cat": "xpu_kernel", "name": "gemm_xe", "pid": 1, "tid": 1, "ts": 200, "dur": 3},
        {"ph": "X", "cat": "xpu_kernel", "name": "gemm_xe", "pid": 1, "tid": 1, "ts": 210, "dur": 3},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    assert len(tr) == 8
    assert "unknown category ignored: xpu_kernel (2)" in " ".join(tr.warnings)


def test_exact_path_even_when_every_float_looks_integral(tmp_path):
    # 1712195495519689.047 parses to the float …689.0: only the text shows the lost 47 ns.
    b = TraceBuilder()
    b.op("aten::add", 111.0, 1.0)
    text = json.dumps(b.document()).replace('"ts": 111.0', '"ts": 1712195495519689.047')
    path = tmp_path / "t.json"
    path.write_text(text)
    assert load_trace(str(path)).ts.tolist() == [1712195495519689047]


# --- kernel launch args and GEMM shapes ------------------------------------------------------------

MM_DIMS = [[1024, 1705], [1705, 512]]


def launch_args_sample() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, 0.0, 1000.0)
    b.op("aten::mm", 10.0, 20.0, dims=MM_DIMS, types=["c10::BFloat16", "c10::BFloat16"])
    b.op("aten::mm", 40.0, 20.0, dims=MM_DIMS, types=["c10::BFloat16", "c10::BFloat16"])  # same shape: one entry
    b.op("aten::addmm", 70.0, 20.0, dims=[[512], [64, 100], [100, 512], [], []],
         types=["float", "float", "float", "Scalar", "Scalar"])
    b.op("aten::add", 100.0, 5.0, dims=[[64, 64], [64, 64], []], types=["float", "float", "Scalar"])  # sized for bytes
    b.op("aten::view", 106.0, 1.0, dims=[[64, 64], []], types=["float", ""])  # launches nothing: not kept
    b.op("aten::mm", 110.0, 5.0)  # a GEMM recorded without shapes
    b.kernel("k_full", 200.0, 10.0, launch_at=190.0, blocks_per_sm=0.5, warps_per_sm=8, occupancy=12)
    b.kernel("k_absent", 220.0, 10.0, launch_at=211.0)
    b.kernel("k_unknown_sms", 240.0, 10.0, launch_at=231.0, blocks_per_sm=-1.0, warps_per_sm=-1.0, occupancy=0)
    b.kernel("Memcpy HtoD (Pinned -> Device)", 260.0, 5.0, cat="gpu_memcpy", launch_at=251.0, nbytes=64)
    return b


def launch_columns(tr) -> dict[str, list]:
    """Per event name: [blocks, warps, occupancy (NaN as None), shape texts or None] in time order."""
    out: dict[str, list] = {}
    for i in np.argsort(tr.ts, kind="stable"):
        f = [None if np.isnan(x) else float(x) for x in (tr.blocks_per_sm[i], tr.warps_per_sm[i], tr.occupancy[i])]
        shape = tr.shapes[tr.shape[i]] if tr.shape[i] >= 0 else None
        out.setdefault(tr.names[tr.name[i]], []).append((*f, shape))
    return out


EXPECTED_LAUNCH = {
    "k_full": [(0.5, 8.0, 12.0, None)],
    "k_absent": [(None, None, None, None)],
    # Kineto writes -1 without the device's SM count: absent. A 0% occupancy is a real value.
    "k_unknown_sms": [(None, None, 0.0, None)],
    "Memcpy HtoD (Pinned -> Device)": [(None, None, None, None)],
    "aten::mm": [(None, None, None, (b"[[1024,1705],[1705,512]]", b'["c10::BFloat16","c10::BFloat16"]', b""))] * 2
    + [(None, None, None, None)],
    "aten::addmm": [(None, None, None, (b"[[512],[64,100],[100,512],[],[]]",
                                        b'["float","float","float","Scalar","Scalar"]', b""))],
    "aten::add": [(None, None, None, (b"[[64,64],[64,64],[]]", b'["float","float","Scalar"]', b""))],
    "aten::view": [(None, None, None, None)],
}


def test_launch_args_and_gemm_shapes_become_columns(tmp_path):
    tr = load_trace(str(launch_args_sample().write(tmp_path / "t.json")))
    got = launch_columns(tr)
    for name, want in EXPECTED_LAUNCH.items():
        assert got[name] == want, name
    assert tr.blocks_per_sm.dtype == np.float32 and tr.shape.dtype == np.int32
    assert len(tr.shapes) == 3  # interned: the two identical aten::mm shapes share one entry
    # Events without args at all (the step annotation, runtime calls) have every column absent.
    assert all(v == (None, None, None, None) for v in got["ProfilerStep#1"] + got["cudaLaunchKernel"])


def test_launch_args_same_on_every_decode_path(tmp_path, monkeypatch):
    from torchdoctor.trace import parallel

    doc = launch_args_sample().document()
    compact = json.dumps(doc, separators=(",", ":"))
    ref = launch_columns(load_trace(str(launch_args_sample().write(tmp_path / "ref.json"))))
    # Small blocks (cut between events), the parallel byte ranges, a list at the top level.
    path = tmp_path / "c.json"
    path.write_text(compact)
    monkeypatch.setattr(decode, "BLOCK_BYTES", 300)
    assert launch_columns(load_trace(str(path))) == ref
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "PROBE_BYTES", 512)
    assert launch_columns(load_trace(str(path), jobs=2)) == ref
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps(doc["traceEvents"]))
    assert launch_columns(load_trace(str(listed))) == ref
    # The exact-timestamp decoder (epoch-scale µs with ns decimals).
    exact = tmp_path / "e.json"
    exact.write_text(json.dumps(doc).replace('"ts": 0.0,', '"ts": 1712195495519689.047,', 1))
    got = launch_columns(load_trace(str(exact)))
    assert {k: v for k, v in got.items() if k != "ProfilerStep#1"} == {k: v for k, v in ref.items()
                                                                        if k != "ProfilerStep#1"}


def test_launch_args_survive_the_lenient_path(tmp_path):
    # One wrongly typed field sends the piece through the event-by-event decoder; the other
    # events keep their args, a bad value becomes absent.
    doc = launch_args_sample().document()
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k_bad", "pid": 0, "tid": 7, "ts": 300, "dur": 1,
                               "args": {"stream": 7, "blocks per SM": "many", "est. achieved occupancy %": 50,
                                        "correlation": "x"}})
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::bmm", "pid": 1, "tid": 1, "ts": 310,
                               "dur": "1", "args": {"Input Dims": [[2, 3, 4], [2, 4, 5]], "Input type": ["c10::Half"] * 2,
                                                  "External id": "bad"}})
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 320,
                               "dur": 1, "args": {"Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3]], "Input type": ["float"] * 2,
                                                  "Concrete Inputs": ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]}})
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k_grid", "pid": 0, "tid": 7, "ts": 330, "dur": 1,
                               "args": {"stream": 7, "grid": [4, 3, 2], "blocks per SM": -1}})
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                               "ts": 340, "dur": 1, "args": {"Collective name": "allreduce", "dtype": "Float"}})
    # Dropped events (no ts) before the kept ones: the sparse rows are renumbered, a dropped
    # kernel's launch args go with it.
    doc["traceEvents"][1:1] = [
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "k_no_ts", "pid": 0, "tid": 7, "dur": 3,
         "args": {"stream": 7, "blocks per SM": 3.0}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    got = launch_columns(tr)
    for name, want in EXPECTED_LAUNCH.items():
        assert got[name] == want, name
    assert got["k_bad"] == [(None, None, 50.0, None)]
    assert "no_ts" not in got and "k_no_ts" not in got
    assert "2 events dropped: missing or non-numeric ts/dur" in tr.warnings
    assert got["aten::bmm"] == [(None, None, None, (b"[[2,3,4],[2,4,5]]", b'["c10::Half","c10::Half"]', b""))]
    # Every Args field arrives in its own slot (keyword construction): a convolution's Concrete
    # Inputs, a kernel's grid where blocks per SM is absent, a collective's metadata.
    assert got["aten::conv2d"] == [(None, None, None, (b"[[1,3,8,8],[4,3,3,3]]", b'["float","float"]',
                                                       b'["","","","[1, 1]","[0, 0]","[1, 1]","1"]'))]
    (k,) = np.flatnonzero(tr.name == tr.names.index("k_grid"))
    assert tr.grid_of(np.array([k])).tolist() == [24.0]
    (c,) = np.flatnonzero(tr.name == tr.names.index("record_param_comms"))
    assert tr.colls[tr.coll_ids[tr.coll_idx.tolist().index(c)]][:2] == ("allreduce", "Float")


def test_event_and_args_structs_sit_in_different_allocator_size_classes():
    # pymalloc rounds object sizes up to 16 bytes; two struct types in one class interleave in
    # memory and every pass over the decoded events slows down (see decode.Event's padding).
    def size_class(obj) -> int:
        return (obj.__sizeof__() + 15) // 16

    assert size_class(decode.Args()) != size_class(decode.Event())
    assert size_class(decode.Args()) != size_class(decode.ExactEvent())


def test_sparse_launch_and_shape_lookups(tmp_path):
    tr = load_trace(str(launch_args_sample().write(tmp_path / "t.json")))
    by_name = {n: np.flatnonzero(tr.name == tr.names.index(n)) for n in ("k_full", "k_absent", "aten::mm", "aten::add")}
    idx = np.concatenate([by_name["k_full"], by_name["k_absent"], by_name["aten::add"]])
    blocks, warps, occ = tr.launch_of(idx)
    assert blocks.tolist()[0] == 0.5 and warps.tolist()[0] == 8.0 and occ.tolist()[0] == 12.0
    assert np.isnan(blocks[1:]).all() and np.isnan(occ[1:]).all()
    assert tr.launch_idx.tolist() == sorted(tr.launch_idx.tolist())  # sorted event indices
    mm = tr.shape_of(by_name["aten::mm"])
    assert mm.tolist()[:2] == [0, 0] and mm.tolist()[2] == -1
    # aten::add is sized (elementwise bytes); views launch nothing and are not kept.
    assert tr.shape_of(by_name["aten::add"]).tolist() == [2]
    # The dense views agree with the lookups.
    assert np.array_equal(tr.blocks_per_sm[idx], blocks, equal_nan=True)
    assert tr.shape[by_name["aten::mm"]].tolist() == mm.tolist()


# --- msgspec's error wording: pinned, and a fallback when it changes ------------------------------

def test_the_pinned_msgspec_words_errors_as_the_cutter_reads_them():
    """The streaming cutter reads these messages; a msgspec that rewords them fails here first."""
    def message(doc: bytes) -> str:
        with pytest.raises(decode.msgspec.DecodeError) as e:
            decode._raw_list.decode(doc)
        return str(e.value)

    assert "truncated" in message(b'[{"ph": "X", "args": {"a": 1}')
    assert "trailing characters" in message(b'[{"ph": "X"}], "x": 1}')
    assert "(byte 14)" in message(b'[{"ph": "X"}, }, {"ph": "X"}]')
    assert decode.streaming_supported()


def test_a_reworded_msgspec_is_detected(monkeypatch):
    class Reworded:
        def decode(self, doc):
            raise decode.msgspec.DecodeError("some other wording")

    decode.streaming_supported.cache_clear()
    monkeypatch.setattr(decode, "_raw_list", Reworded())
    try:
        assert not decode.streaming_supported()
    finally:
        decode.streaming_supported.cache_clear()


@pytest.mark.parametrize("as_list", [False, True])
def test_unknown_error_wording_falls_back_to_an_exact_whole_file_decode(tmp_path, monkeypatch, as_list):
    b = TraceBuilder(rank=3)
    tricky = ['void f<{lambda()#1}>(x)}, {"ph": "X"', "a}, {b"]
    for i in range(400):
        b.op(tricky[i % 2] + str(i), 10.0 * i, 5.0)
        b.kernel(f"k{i}", 10.0 * i + 1, 2.0, launch_at=10.0 * i)
    path = b.write(tmp_path / "t.json.gz", as_list=as_list)
    ref = load_trace(str(path))
    monkeypatch.setattr(decode, "streaming_supported", lambda: False)
    called = []
    real = decode._decode_whole
    monkeypatch.setattr(decode, "_decode_whole", lambda *a: called.append(1) or real(*a))
    got = load_trace(str(path))
    assert called and columns(got) == columns(ref) and len(got) == 1200
    assert got.rank == (None if as_list else 3) == ref.rank


def test_whole_file_fallback_keeps_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "streaming_supported", lambda: False)
    cases = [(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts"', "ends in the middle"),
             (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}} ]}', "invalid JSON"),
             (b"", "empty file"), (b"hello", "not JSON"), (b'{"traceEvents": 5}', "not a list")]
    for content, message in cases:
        path = tmp_path / "bad.json"
        path.write_bytes(content)
        with pytest.raises(TraceFormatError, match=message):
            load_trace(str(path))


@pytest.mark.parametrize("streaming", [True, False])
def test_an_execution_trace_is_named_as_one(tmp_path, monkeypatch, streaming):
    """facebookresearch/param's et_replay inputs: an ExecutionTraceObserver file read 'no traceEvents key'."""
    if not streaming:
        monkeypatch.setattr(decode, "streaming_supported", lambda: False)
    path = tmp_path / "resnet_et.json"
    path.write_text('{"schema": "1.1.0-chakra.0.0.4", "pid": 7, "time": "2023-10-09", "start_ts": 1, '
                    '"nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0}]}')
    with pytest.raises(TraceFormatError, match=r"a PyTorch execution trace \(ExecutionTraceObserver, schema "
                                               r"1\.1\.0-chakra\.0\.0\.4\), not a Kineto trace"):
        load_trace(str(path))
