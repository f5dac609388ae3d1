"""The compiled scanner (trace/_scan.c, trace/scanned.py) against msgspec's decode of the same files.

Every test decodes a file twice, with the scanner and with ``TORCHDOCTOR_PURE_DECODE=1`` (msgspec
alone, the reference), and asserts that everything the analysis reads is identical: the columns,
names, sparse rows, shapes, collectives, dropped counts, memory records and header, or the same
one-line error. Where the scanner is not built these tests skip, except under .ci/run
(``TORCHDOCTOR_REQUIRE_SCANNER=1``), where a missing scanner fails.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest

from kineto_builder import TraceBuilder
from torchdoctor.trace import decode, scanned
from torchdoctor.trace.decode import TraceFormatError

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = sorted(p for p in DATA.rglob("*.json*") if p.is_file())

if not scanned.available():
    if os.environ.get("TORCHDOCTOR_REQUIRE_SCANNER") == "1":
        raise RuntimeError("the trace scanner (torchdoctor/trace/_scan.c) is not built: "
                           "`pip install -e .` compiles it (needs a C compiler and Python's headers)")
    pytest.skip("the trace scanner is not built in this environment", allow_module_level=True)


def read(path: Path, pure: bool, monkeypatch, block: int | None = None):
    """Everything decode_file gives the analysis, and (pieces scanned, pieces decoded by msgspec)."""
    monkeypatch.setenv("TORCHDOCTOR_PURE_DECODE", "1" if pure else "0")
    if block:
        monkeypatch.setattr(decode, "BLOCK_BYTES", block)
    try:
        header, cols = decode.decode_file(str(path))
    except TraceFormatError as e:
        return {"error": str(e)}, (0, 0)
    names, columns, sparse = cols.finish()
    got = {"names": names, "columns": columns, "sparse": [getattr(sparse, f) for f in sparse.__dataclass_fields__],
           "shapes": cols.shapes, "colls": cols.colls, "dropped": cols.dropped, "instants": cols.instants,
           "memory": cols.memory_rows(), "categories": cols.category_counts, "unknown": cols.unknown_cats,
           "exact": cols.exact,
           "header": (header.distributedInfo, header.deviceProperties, header.computeProperties)}
    return got, (cols.pieces_scanned, cols.pieces_decoded)


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def differences(a: dict, b: dict) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not same(a[k], b[k]))


def assert_same(path: Path, monkeypatch, block: int | None = None) -> tuple[int, int]:
    fast, pieces = read(path, False, monkeypatch, block)
    ref, ref_pieces = read(path, True, monkeypatch, block)
    assert ref_pieces[0] == 0  # the reference really ran without the scanner
    assert not differences(fast, ref), (path.name, differences(fast, ref), fast.get("error"), ref.get("error"))
    return pieces


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
@pytest.mark.parametrize("block", [None, 1 << 16])
def test_real_traces_decode_identically(path, block, monkeypatch):
    scanned_pieces, decoded = assert_same(path, monkeypatch, block)
    # The scanner reads them, but where msgspec's lenient path is needed (ROCm's string-typed
    # `bytes` / `stream` args): there it hands the piece back.
    rocm = path.name.startswith(("mi250", "tracelens_mi300"))
    assert scanned_pieces > 0 or rocm
    if not rocm:
        assert decoded == 0


def builder() -> TraceBuilder:
    """A trace with every field the decoder reads: shapes, launch args, collectives, memory records,
    string thread ids, steps."""
    b = TraceBuilder(world_size=2)
    b.step(1, 100.0, 900.0)
    b.gemm("aten::mm", 110.25, 20.5, [[64, 128], [128, 32]])
    b.launching("aten::convolution", 200.0, 30.0, "implicit_convolve_sgemm", 240.0, 12.5,
                dims=[[8, 3, 32, 32], [16, 3, 3, 3], [], [], [], [], [], [], []],
                types=["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList",
                       "Scalar"], concrete=["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"])
    b.kernel("sgemm_a", 300.001, 0.4, launch_at=280.0, blocks_per_sm=0.5, warps_per_sm=2.0, occupancy=6)
    b.kernel("sgemm_b", 301.5, 1.0, launch_at=281.0, blocks_per_sm=-1, grid=[54, 2, 1])
    b.kernel("Memcpy HtoD (Pageable -> Device)", 310.0, 3.0, cat="gpu_memcpy", nbytes=1 << 20, launch_at=290.0)
    b.memory(320.0, 4096, 8192, 1 << 21)
    b.memory(321.0, -4096, 4096, 1 << 21, device_type=0)
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 4242, "tid": 4242,
                     "ts": 400.0, "dur": 50.0, "args": {"Collective name": "allreduce", "dtype": "Float",
                                                        "In msg nelems": 1024, "Out msg nelems": 1024,
                                                        "Group size": 2, "Process Group Name": "0", "Seq": 7}})
    b.events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
                     "tid": 7, "ts": 460.0, "dur": 80.0,
                     "args": {"stream": 7, "correlation": 5, "Collective name": "allreduce", "Seq": "7"}})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 4242, "tid": "25738",
                     "ts": 600.0, "dur": 2.0})
    b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "pid": 0,
                     "tid": "stream 7", "ts": 460.0, "dur": 80.0})
    b.events.append({"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0 \u00e9\u4e2d \"q\" \\ \t",
                     "pid": 4242, "tid": 4242, "ts": 700.0, "dur": 5.0})
    b.events.append({"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 300.001, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    b.events.append({"ph": "C", "name": "counter", "pid": 0, "ts": 5.0, "args": {"x": [1, {"y": None}]}})
    b.step(2, 1000.0, 500.0)
    return b


def write(tmp_path: Path, doc, name: str = "t.json", indent: int | None = None) -> Path:
    path = tmp_path / name
    text = json.dumps(doc, indent=indent, ensure_ascii=False).encode()
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return path


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("block", [None, 256])
@pytest.mark.parametrize("indent", [None, 1])
def test_every_field_decodes_identically(tmp_path, monkeypatch, as_list, block, indent):
    path = write(tmp_path, builder().document(as_list), indent=indent)
    scanned_pieces, decoded = assert_same(path, monkeypatch, block)
    assert scanned_pieces >= 1 and decoded == 0
    got, _ = read(path, False, monkeypatch, block)
    # The numbers themselves, not only their agreement with msgspec.
    assert got["colls"] == [("allreduce", "Float", 1024, 1024, 2, "0"), ("allreduce", "", -1, -1, -1, "")]
    assert sorted(got["sparse"][9].tolist()) == [7, 7]  # Seq as an int and as a numeric string
    assert got["memory"].tolist() == [[320000, 4096, 8192, 1 << 21, 0]]
    names = got["names"]
    cols = got["columns"]
    k = names.index("sgemm_a")
    at = np.flatnonzero(cols[1] == k)[0]
    assert cols[2][at] == 300_001 and cols[3][at] - cols[2][at] == 400  # ts and dur in ns
    assert names.index("nn.Module: Linear_0 \u00e9\u4e2d \"q\" \\ \t") >= 0
    add = np.flatnonzero(cols[1] == names.index("aten::add_"))[0]
    assert cols[5][add] == 25738  # a numeric string tid is that thread
    ann = np.flatnonzero(cols[1] == names.index("nccl:all_reduce"))[0]
    assert cols[5][ann] < 0  # a named pseudo-thread


# One event per case: each is decoded as a whole file, both ways. Cases the scanner hands back to
# msgspec are here as much as those it reads: the point is that the two ways never differ.
ODD_EVENTS = [
    b'{"ph":"X","name":"a","ts":-0,"dur":-0.0}',
    b'{"ph":"X","name":"a","ts":1.5e3,"dur":25E-1}',
    b'{"ph":"X","name":"a","ts":1E400,"dur":1}',
    b'{"ph":"X","name":"a","ts":1661203462755402,"dur":3}',
    b'{"ph":"X","name":"a","ts":9007199254740993,"dur":3}',
    b'{"ph":"X","name":"a","ts":12345678901234567890123,"dur":3}',
    b'{"ph":"X","name":"a","ts":1712195495519689.047,"dur":3.0005}',
    b'{"ph":"X","name":"a","ts":0.1000000000000000055511151231257827,"dur":0.30000000000000004}',
    b'{"ph":"X","name":"a","ts":4.9406564584124654e-324,"dur":2.2250738585072011e-308}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"pid":18446744073709551616,"tid":-9223372036854775808}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"pid":"Spans","tid":"-12"}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"pid":1.0}',
    b'{"ph":"X","name":"a","name":"b","ts":100,"dur":1}',
    b'{"ph":"X","n\\u0061me":"q","ts":100,"dur":1}',
    b'{"ph":"\\u0058","name":"q","ts":100,"dur":1}',
    b'{"ph":"X","ph":"i","ts":100}',
    b'{"name":"late tag","ts":100,"dur":1,"ph":"X"}',
    b'{"ph":"X","name":"\\ud83d\\ude00","ts":100,"dur":1}',
    b'{"ph":"X","name":"\\u00e9\\n\\/","ts":100,"dur":1}',
    b'{"ph":"X","name":"\xc3\xa9\xe4\xb8\xad","ts":100,"dur":1}',
    b'{"ph":"X","name":"\xff","ts":100,"dur":1}',
    b'{"ph":"X","name":"a","other":"\xff\xfe","ts":100,"dur":1}',
    b'{"ph":"X","name":"a\x01","ts":100,"dur":1}',
    b'{"ph":"X","name":"a","ts":"100","dur":1}',
    b'{"ph":"X","name":"a","ts":null,"dur":1}',
    b'{"ph":"X","cat":null,"ts":100,"dur":1}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":null}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"stream":7.0}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"stream":"0x0","bytes":"12"}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"stream":7,"stream":8,"correlation":-0}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"bytes":18446744073709551615}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"blocks per SM":null}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":100,"dur":1,"args":{"blocks per SM":3,"grid":[1,"2",3]}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":100,"dur":1,"args":{"grid":[2, 3, 4],"grid":{"x":1}}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"str\\u0065am":7}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"x":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"x":' + b"[" * 200 + b"]" * 200 + b"}}",
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"x":tru}}',
    b'{"ph":"X","name":"a","ts":01,"dur":1}',
    b'{"ph":"X","name":"a","ts":1.,"dur":1}',
    b'{"ph":"X","name":"a","ts":.5,"dur":1}',
    b'{"ph":"X","name":"a","ts":100,"dur":-3}',
    b'{"ph":"X","name":"a","ts":100,"dur":1e20}',
    b'{"ph":"Q","name":"a","ts":100}',
    b'{"name":"a","ts":100}',
    b'{}',
    b'[1]',
    b'{"ph":"i","name":"[memory]","ts":5,"args":{"Device Type":1,"Bytes":8,"Total Allocated":8,'
    b'"Total Reserved":64,"Device Id":0}}',
    b'{"ph":"i","name":"[memory]","ts":5,"args":{"x":"\xff"}}',
    b'{"ph":"I","name":"instant","ts":5}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"~torchdoctor padding":1}',
    # A known key twice: msgspec checks each copy, so a bad first one sends the event to the
    # lenient path (found by review: the scanner used to read only the last copy).
    b'{"ph":"X","name":"aten::mm","ts":"x","ts":5,"dur":1,"args":{"Input Dims":"abc"}}',
    b'{"ph":"X","name":"aten::mm","ts":5,"dur":1,"args":{"stream":"x"},"args":{"Input Dims":"abc"}}',
    b'{"ph":"X","name":"a","ts":1e400,"ts":5,"dur":1}',
    b'{"ph":"X","name":"aten::mm","ts":5,"dur":1,"~torchdoctor padding":1,"args":{"Input Dims":"abc"}}',
    b'{"ph":"X","name":"a","ts":1712195495519689.047,"dur":"x","dur":1}',
    b'{"ph":"X","name":"aten::mm","ts":5,"dur":1,"args":{"Input Dims":[[2,3]],"Input Dims":[[4]]}}',
]


@pytest.mark.parametrize("event", ODD_EVENTS, ids=range(len(ODD_EVENTS)))
@pytest.mark.parametrize("as_list", [False, True])
def test_odd_events_decode_identically(tmp_path, monkeypatch, event, as_list):
    good = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":50,"dur":2}'
    events = b"[" + good + b", " + event + b", " + good + b"]"
    doc = events if as_list else b'{"schemaVersion": 1, "traceEvents": ' + events + b', "displayTimeUnit": "ms"}'
    path = tmp_path / "t.json"
    path.write_bytes(doc)
    assert_same(path, monkeypatch)
    assert_same(path, monkeypatch, block=64)


READ_BY_THE_SCANNER = [
    b'{"ph":"X","name":"a","ts":-0,"dur":-0.0}',
    b'{"ph":"X","name":"a","ts":1.5e3,"dur":25E-1}',
    b'{"ph":"X","name":"a","ts":1661203462755402,"dur":3}',
    b'{"ph":"X","name":"a","ts":9007199254740993,"dur":3}',
    b'{"ph":"X","name":"a","ts":1712195495519689.047,"dur":3.0005}',
    b'{"ph":"X","name":"a","ts":4.9406564584124654e-324,"dur":2.2250738585072011e-308}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"pid":"Spans","tid":"-12"}',
    b'{"ph":"X","name":"\\u00e9\\n\\/","ts":100,"dur":1}',
    b'{"ph":"X","name":"\xc3\xa9\xe4\xb8\xad","ts":100,"dur":1}',
    b'{"ph":"X","name":"a","other":"\xff\xfe","ts":100,"dur":1}',
    b'{"ph":"X","name":"a","ts":100,"dur":1,"args":{"stream":7,"stream":8,"correlation":-0}}',
    b'{"name":"late tag","ts":100,"dur":1,"ph":"X"}',
    b'{"ph":"i","name":"[memory]","ts":5,"args":{"Device Type":1,"Bytes":8,"Total Allocated":8,'
    b'"Total Reserved":64,"Device Id":0}}',
]


@pytest.mark.parametrize("event", READ_BY_THE_SCANNER, ids=range(len(READ_BY_THE_SCANNER)))
def test_the_scanner_reads_the_common_odd_cases_itself(tmp_path, monkeypatch, event):
    """Not a fallback for everything: numbers in every JSON form, escapes in names, string ids,
    duplicate args keys, a late tag and instants are read by the scanner (no piece handed over)."""
    path = tmp_path / "t.json"
    path.write_bytes(b"[" + event + b"]")
    assert_same(path, monkeypatch)
    _, (scanned_pieces, decoded) = read(path, False, monkeypatch)
    assert (scanned_pieces, decoded) == (1, 0)


@pytest.mark.parametrize("event", ODD_EVENTS, ids=range(len(ODD_EVENTS)))
@pytest.mark.parametrize("exact", [False, True])
def test_a_piece_msgspec_rejects_is_one_the_scanner_gives_up(event, exact):
    """The scanner's contract, checked directly: where msgspec's typed decode raises (so the piece
    goes to the lenient path or is an error), scanning gives the piece up (None). Comparing final columns alone
    would miss a case the lenient path happens to rebuild identically."""
    good = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":50,"dur":2}'
    piece = b"[" + good + b", " + event + b"]"
    dec = decode.EXACT if exact else decode.FAST
    try:
        dec.events.decode(piece)
        rejected = False
    except (msgspec.DecodeError, msgspec.ValidationError):
        rejected = True
    # The scanner with the Python side's checks of what it hands back (strings decoded by msgspec).
    got = scanned.scan_piece(decode.Columns(dec=dec), piece)
    if rejected:
        assert got is None


def test_a_second_event_array_after_the_first_is_read_as_msgspec_reads_it(tmp_path, monkeypatch):
    """msgspec keeps the last of two "traceEvents" keys, even an empty one (found by review)."""
    ev = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":5,"dur":1}'
    for second in (b"[]", b"[" + ev.replace(b'"a"', b'"b"') + b"]"):
        path = tmp_path / "t.json"
        path.write_bytes(b'{"traceEvents": [' + ev + b'], "traceEvents": ' + second + b"}")
        assert_same(path, monkeypatch)


def test_a_file_whose_pieces_the_scanner_keeps_handing_over_goes_to_msgspec(tmp_path, monkeypatch):
    """ROCm's string-typed `bytes` in every block: after two hand-overs the rest is not scanned first."""
    ev = b'{"ph":"X","cat":"cuda_runtime","name":"hipMemcpy","pid":1,"tid":1,"ts":%d,"dur":1,"args":{"bytes":"8"}}'
    path = tmp_path / "t.json"
    path.write_bytes(b"[" + b",".join(ev % i for i in range(200)) + b"]")
    assert_same(path, monkeypatch, block=512)
    monkeypatch.setenv("TORCHDOCTOR_PURE_DECODE", "0")
    _, cols = decode.decode_file(str(path))
    assert cols.pieces_scanned == 0 and cols.handed_over == 2 and cols.scanner is None


def colliding_names(seed: int, count: int) -> list[bytes]:
    """8-byte names whose hash under `seed` (_scan.c's hash_bytes, inverted) is the same modulo 2^24."""
    mask = (1 << 64) - 1
    k = 0x9E3779B97F4A7C15
    k_inv = pow(k, -1, 1 << 64)

    def unshift(h: int, s: int) -> int:  # inverse of h ^= h >> s
        x = h
        for _ in range(64 // s + 1):
            x = h ^ (x >> s)
        return x & mask

    rng = random.Random(seed)
    out: list[bytes] = []
    while len(out) < count:
        h = (rng.getrandbits(40) << 24) | 0xABCDE  # the target: same low 24 bits
        h = unshift(h, 32)  # final step: h ^= h >> 32
        h = (h * k_inv) & mask  # h = (h ^ 0) * k, the empty tail word
        h = unshift(h, 29)  # the one full word: h ^= h >> 29
        h = (h * k_inv) & mask  # h = (h ^ w) * k
        w = (h ^ seed ^ 8).to_bytes(8, "little")  # h started as seed ^ len
        if all(0x20 <= c < 0x7F and c not in b'"\\' for c in w):
            out.append(w)
    return out


def test_colliding_strings_cannot_slow_the_scanner_down():
    """Names crafted to collide under one key: the scanner gives the piece up after MAX_PROBE probes
    (msgspec then reads it) instead of slowing down quadratically; under another key, such as the
    random one each file's scanner gets, the same names do not collide and are read."""
    names = colliding_names(1, 1500)
    piece = b"[" + b",".join(b'{"ph":"X","name":"%s","ts":1,"dur":1}' % n for n in names) + b"]"
    assert scanned._scan.Scanner(1).scan(piece, False) is None
    got = scanned._scan.Scanner(2).scan(piece, False)
    assert got is not None and len(got[2]) == 1500


def mutate(doc: bytes, rng: random.Random) -> bytes:
    out = bytearray(doc)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(out))
        choice = rng.random()
        if choice < 0.6:
            out[i] = ord(rng.choice('{}[]",:0123456789.-+eE \\u/nX'))
        elif choice < 0.8:
            del out[i]
        else:
            out[i] = rng.randrange(256)
    return bytes(out)


@pytest.mark.parametrize("seed", range(6))
def test_mutated_traces_decode_identically_or_fail_alike(tmp_path, monkeypatch, seed):
    """Random damage (fixed seeds: the same files every run) to a trace with every field: the scanner
    and msgspec agree on each file, the same columns or the same error."""
    rng = random.Random(seed)
    doc = json.dumps(builder().document(as_list=seed % 2 == 1), separators=(",", ":")).encode()
    outcomes = set()
    for i in range(60):
        path = tmp_path / f"m{i}.json"
        path.write_bytes(mutate(doc, rng))
        got, _ = read(path, True, monkeypatch, 512)
        outcomes.add("error" in got)
        assert_same(path, monkeypatch, block=512)
    assert outcomes == {True, False}  # both readable and broken files were among them


@pytest.mark.parametrize("exact", [False, True])
def test_random_numbers_read_as_msgspec_reads_them(tmp_path, monkeypatch, exact):
    """ts / dur / launch args in many number shapes (long mantissas, exponents, 16-19 digit integers,
    values either side of 2^53): the same float64 as msgspec's, so the same ns. With `exact`, epoch
    µs timestamps with decimals, which both read as text (ns exact)."""
    rng = random.Random(7)

    def number(kinds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> str:
        kind = rng.choice(kinds)
        if kind == 0:
            return str(rng.randrange(10 ** rng.randint(1, 19)))
        if kind == 1:
            return f"{rng.randrange(10 ** 15, 10 ** 16)}.{rng.randrange(10 ** rng.randint(1, 12))}"
        if kind == 2:
            return f"{rng.randrange(1, 10)}.{rng.randrange(10 ** 17)}e{rng.randint(-30, 11)}"
        if kind == 3:
            return str(2 ** 53 + rng.randint(-3, 3))
        return repr(rng.uniform(0, 1e12))

    # A decimal timestamp of 13+ integer digits (or a fractional one past 2^43 µs) makes the file
    # exact; an exponent in one is left to msgspec there (decode.py's _raw_to_ns reads it through
    # Decimal).
    ts_kinds = (0, 1, 3) if exact else (0, 2, 3, 4)
    events = [f'{{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":{number(ts_kinds)},"dur":{number()},'
              f'"args":{{"blocks per SM":{number()},"warps per SM":{number()},'
              f'"est. achieved occupancy %":{number()}}}}}' for _ in range(3000)]
    path = tmp_path / "n.json"
    path.write_text("[" + ",".join(events) + "]")
    scanned_pieces, decoded = assert_same(path, monkeypatch)
    assert (scanned_pieces, decoded) == (1, 0)
    assert read(path, False, monkeypatch)[0]["exact"] is exact


def test_integers_of_every_length_and_sign_read_as_msgspec_reads_them(tmp_path, monkeypatch):
    """The scanner's integer paths (eight digits at a time, no overflow test below 20 digits): every
    length from 1 to 25 digits in the float fields, 1 to 19 and the int64 edges in the int args, with
    and without a sign, and zeros ("-0" is msgspec's int 0). Read by the scanner, the same as msgspec."""
    rng = random.Random(11)

    def digits(n: int) -> str:
        return str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in range(n - 1))

    floats = ["0", "-0"] + [sign + digits(n) for n in range(1, 26) for sign in ("", "-") for _ in range(3)]
    ints = ["0", "-0", str(2 ** 63 - 1), str(-2 ** 63)] + [sign + digits(n) for n in range(1, 19)
                                                           for sign in ("", "-") for _ in range(3)]
    events = [f'{{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":{f},"dur":{rng.choice(floats)},'
              f'"args":{{"stream":{i},"correlation":{rng.choice(ints)},"bytes":{rng.choice(ints)},'
              f'"blocks per SM":{rng.choice(floats)}}}}}'
              for f, i in zip(floats * 2, ints * 3, strict=False)]
    path = tmp_path / "ints.json"
    path.write_text("[" + ",".join(events) + "]")
    assert read(path, False, monkeypatch)[1] == (1, 0)
    assert_same(path, monkeypatch)


def test_strings_with_an_escape_at_every_offset_read_as_msgspec_reads_them(tmp_path, monkeypatch):
    """Names and args strings scanned sixteen bytes at a time: an escape, a multi-byte character or
    the closing quote at every offset across two such words reads as msgspec reads it."""
    events = []
    for n in range(40):
        for esc in ('\\"', "\\\\", "\\u00e9", "\\n", "\u4e2d"):
            name = "a" * n + esc + "b" * (39 - n)
            events.append(f'{{"ph":"X","cat":"cpu_op","name":"{name}","pid":1,"tid":1,"ts":{n},"dur":1,'
                          f'"args":{{"Call stack":"{"c" * n}","Input type":["{name}", "{"d" * n}"]}}}}')
    path = tmp_path / "strings.json"
    path.write_text("[" + ",".join(events) + "]", encoding="utf-8")
    assert read(path, False, monkeypatch)[1] == (1, 0)
    got, _ = read(path, True, monkeypatch)
    assert len(got["names"]) == 40 * 5 and '"' in got["names"][0] and "\u4e2d" in got["names"][4]
    assert_same(path, monkeypatch)


def test_a_stale_or_missing_scanner_leaves_msgspec_doing_the_work(tmp_path, monkeypatch):
    path = write(tmp_path, builder().document())
    monkeypatch.setattr(scanned, "_scan", None)
    _, (scanned_pieces, decoded) = read(path, False, monkeypatch)
    assert scanned_pieces == 0 and decoded == 1
