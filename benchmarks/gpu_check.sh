#!/usr/bin/env bash
# The project's GPU check: a few minutes on the GPU machine (one H200, /work/shared/gpu/README.md).
#
#   bash benchmarks/gpu_check.sh OUT_DIR            # on the GPU machine (about 5 minutes)
#   bash benchmarks/gpu_check.sh OUT_DIR --dry-run  # CPU, smallest sizes, ~1-2 minutes (CI runs it:
#                                                   # tests/benchmarks/test_gpu_check.py)
#
# The GPU machine has no network and lacks msgspec and plotly: their wheels travel with the
# working tree in the git-ignored .whl/ folder. Fetch them beforehand on a machine with a registry
# (benchmarks/fetch_gpu_wheels.sh runs exactly this):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl msgspec==0.23.0 plotly==7.1.0
#
# Steps (each bounded by `timeout`; a failing step is recorded with its exit code and the rest
# still run):
#   env            nvidia-smi, python, torch, CUDA, cuDNN and NCCL versions, device properties
#   wheels         GPU: pip install --no-index --no-deps .whl/*.whl into /tmp/site
#                  (PYTHONPATH=/tmp/site:$PWD/src); dry run: no install, msgspec/plotly imported
#   demo_sick      `torchdoctor demo` (all pathologies), the demo's own device choice: 2 ranks,
#                  NCCL when each rank has a GPU, else gloo with both ranks on cuda:0 (the demo has
#                  no device option); JSON report
#   demo_healthy   `torchdoctor demo --healthy`
#   demo_fix       `torchdoctor demo --fix --apply safe` (dry run: one round, remedies taken
#                  --from the demo_sick run instead of a diagnosis run of its own)
#   analyze_*      `torchdoctor analyze` on the traces the demo runs recorded
#   path_*         benchmarks/gpu_pathologies.py --case X under `torchdoctor run` (a module on the
#                  CPU, fp32 matmuls without TF32, unpinned copies, a hidden .item() per step,
#                  AdamW's foreach update),
#                  then `analyze` of each one's trace
#   overhead       benchmarks/probe_overhead.py with small counts
#   bundle         the run directories (facts, small traces) and the other reports in one .tar.gz
# OUT_DIR then holds at most 8 files of at most 16 MiB each: summary.md (printed last: per step
# rc, wall seconds, the top findings of its JSON report), env.txt, steps.log (every step's output,
# tail-capped), demo_sick.json, demo_healthy.json, demo_fix.json, overhead.json, gpu_check.tar.gz.
#
# Environment: GPU_CHECK_PYTHON (interpreter; default python3 on the GPU, the project's .venv or
# $VIRTUAL_ENV in a dry run), GPU_CHECK_BUDGET_S (total time; later steps get what is left, default
# 350 on the GPU, 600 dry), GPU_CHECK_LANES (1 or 2 parallel lanes of steps; default 1 on the GPU
# so that timings are not disturbed, 2 in a dry run), GPU_CHECK_SITE (default /tmp/site).
# Exit status: 0 when every step exited 0, 1 when one did not, 2 on a usage error.
set -uo pipefail

usage() { echo "usage: $0 OUT_DIR [--dry-run]" >&2; exit 2; }
OUT="" DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "gpu_check: unknown option $arg" >&2; usage ;;
    *) [ -z "$OUT" ] || usage; OUT="$arg" ;;
  esac
done
[ -n "$OUT" ] || usage

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
cd "$REPO" || exit 2
PRE_EXISTING=$(find "$OUT" -mindepth 1 -maxdepth 1 | wc -l)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")" || exit 2
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/steps" "$WORK/logs" "$WORK/runs" "$WORK/reports"
RUNS="$WORK/runs" REPORTS="$WORK/reports"
START_S=$(date +%s)

if [ "$DRY" = 1 ]; then
  MODE="dry-run (CPU)"
  if [ -n "${GPU_CHECK_PYTHON:-}" ]; then PY="$GPU_CHECK_PYTHON"
  elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then PY="$VIRTUAL_ENV/bin/python"
  elif [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"
  else PY=python3
  fi
  export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
  export CUDA_VISIBLE_DEVICES=""  # a dry run stays on the CPU even where a GPU is present
  export OMP_NUM_THREADS=1
  BUDGET_S="${GPU_CHECK_BUDGET_S:-600}" LANES="${GPU_CHECK_LANES:-2}"
  DEMO_STEPS=8 DEMO_WINDOW=(--profile-steps 3:6)
  FIX_ARGS=(--steps 8 --repeats 1 --from "$RUNS/demo_sick")
  PATH_ARGS=(--steps 6 --small) PATH_WINDOW=3:5
  OVERHEAD_ARGS=(--pairs 1 --steps 6 --warmup 2 --micro-pairs 0)
  LIM_DEMO=150 LIM_FIX=240 LIM_PATH=90 LIM_ANALYZE=60 LIM_OVERHEAD=180
else
  MODE="gpu"
  PY="${GPU_CHECK_PYTHON:-python3}"
  SITE="${GPU_CHECK_SITE:-/tmp/site}"
  export PYTHONPATH="$SITE:$REPO/src"
  BUDGET_S="${GPU_CHECK_BUDGET_S:-350}" LANES="${GPU_CHECK_LANES:-1}"
  DEMO_STEPS=32 DEMO_WINDOW=()  # the demo's default window, steps 10:13
  FIX_ARGS=(--steps 32 --repeats 2)
  PATH_ARGS=(--steps 30) PATH_WINDOW=10:13
  OVERHEAD_ARGS=(--pairs 2 --steps 64 --warmup 16 --micro-pairs 1)
  LIM_DEMO=90 LIM_FIX=150 LIM_PATH=60 LIM_ANALYZE=60 LIM_OVERHEAD=120
fi
DEADLINE=$((START_S + BUDGET_S))
RESERVE_S=15  # kept for bundle + summary
CASES=(cpu_module fp32_matmul unpinned_copy item_sync unfused_adamw)
TD=("$PY" -m torchdoctor.cli)  # the package's CLI module (cli.py ends in `sys.exit(main())`)
SITE="${SITE:-}"
export PY MODE DRY REPO SITE

# step ID NAME LIMIT_S [--report FILE] [--note TEXT] [--final] -- COMMAND...
# Runs COMMAND under `timeout` (cut to the time left but RESERVE_S, except --final steps), output
# to its own log; records rc and wall.
step() {
  local id=$1 name=$2 limit=$3 report="" note="" reserve=$RESERVE_S rc wall t0 t1 left
  shift 3
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --report) report=$2; shift 2 ;;
      --note) note=$2; shift 2 ;;
      --final) reserve=0; shift ;;
      *) echo "gpu_check: step $name: bad option $1" >&2; return 0 ;;
    esac
  done
  shift
  local log="$WORK/logs/${id}_${name}.log"
  left=$((DEADLINE - $(date +%s) - reserve))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$reserve" = 0 ] && [ "$limit" -lt 10 ] && limit=10  # the bundle always gets its chance
  t0=$(date +%s.%N)
  if [ "$limit" -lt 5 ]; then
    rc=125
    echo "skipped: the time budget (GPU_CHECK_BUDGET_S=$BUDGET_S) is spent" >"$log"
  else
    timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null
    rc=$?
  fi
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  printf 'name=%s\nrc=%s\nwall=%s\nlimit=%s\nreport=%s\nnote=%s\ncommand=%s\n' \
    "$name" "$rc" "$wall" "$limit" "$report" "$note" "$*" >"$WORK/steps/${id}_${name}.rec"
  echo "[gpu_check] $(date +%H:%M:%S) $name: rc=$rc, ${wall} s (limit ${limit} s)"
  return 0
}

env_report() {
  echo "# gpu_check environment: $(date -u +%Y-%m-%dT%H:%M:%SZ), mode $MODE"
  echo "host: $(hostname), $(nproc --all) CPUs ($(nproc) usable), $(uname -sr)"
  echo "repo: $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
  local rc=0
  if [ "$DRY" = 1 ]; then
    echo "nvidia-smi: not run (--dry-run on a CPU machine; CUDA_VISIBLE_DEVICES='')"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || rc=$?
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || rc=$?
  else
    echo "nvidia-smi: not found"
    rc=1
  fi
  echo "python: $PY -> $(command -v "$PY") ($("$PY" -V 2>&1))"
  echo "PYTHONPATH=$PYTHONPATH"
  "$PY" - <<'EOF' || rc=$?
import importlib
import importlib.metadata
import os
import sys

import torch

print(f"torch {torch.__version__} (from {torch.__file__})")
print(f"CUDA runtime (torch.version.cuda): {torch.version.cuda}")
print(f"cuDNN: {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}")
nccl = None
if torch.cuda.is_available():
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001
        nccl = f"unavailable ({type(e).__name__}: {e})"
print(f"NCCL: {nccl}; torch.distributed NCCL available: {torch.distributed.is_nccl_available()}")
print(f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device {i}: {p}")
    print(f"  capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB")
print(f"float32 matmul precision: {torch.get_float32_matmul_precision()}, "
      f"cuda.matmul.allow_tf32: {torch.backends.cuda.matmul.allow_tf32}")
for name, dist in (("numpy", "numpy"), ("rich", "rich"), ("msgspec", "msgspec"), ("plotly", "plotly"),
                   ("triton", "triton"), ("pynvml", "nvidia-ml-py")):
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: missing ({type(e).__name__})")
        continue
    try:
        version = importlib.metadata.version(dist)
    except Exception:  # noqa: BLE001
        version = getattr(mod, "__version__", "?")
    print(f"{name} {version} ({os.path.dirname(mod.__file__ or '')})")
print(f"python {sys.version.split()[0]} at {sys.executable}")
EOF
  return "$rc"
}

wheels() {
  if [ "$DRY" = 1 ]; then
    echo "dry run: no wheel install; msgspec and plotly come from $PY"
  else
    shopt -s nullglob
    local whl=("$REPO"/.whl/*.whl)
    if [ ${#whl[@]} -eq 0 ]; then
      echo "no wheels in $REPO/.whl: run benchmarks/fetch_gpu_wheels.sh on a machine with a registry"
      return 1
    fi
    printf '%s\n' "${whl[@]##*/}"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${whl[@]}"; then
      # No pip, or it refused: a wheel is a zip laid out for site-packages, so unpack it there.
      echo "pip install failed: unpacking the wheels into $SITE instead"
      local w
      for w in "${whl[@]}"; do "$PY" -m zipfile -e "$w" "$SITE" || return $?; done
    fi
  fi
  "$PY" -c 'import msgspec, plotly; print("msgspec", msgspec.__version__, msgspec.__file__); print("plotly", plotly.__version__, plotly.__file__)'
}
export -f env_report wheels

# The steps. IDs order the summary; lanes (below) only change when they run.
s_env() {
  step 01 env 60 -- bash -c env_report
  cp "$WORK/logs/01_env.log" "$OUT/env.txt"
  cat "$OUT/env.txt"
}
s_wheels() { step 02 wheels 60 -- bash -c wheels; }
DEMO_NOTE="the demo picks its device (no option): 2 ranks, NCCL if each has a GPU, else gloo on cuda:0 or CPU"
s_demo_sick() {
  step 03 demo_sick "$LIM_DEMO" --report "$OUT/demo_sick.json" --note "$DEMO_NOTE" -- \
    "${TD[@]}" demo --steps "$DEMO_STEPS" "${DEMO_WINDOW[@]}" --out "$RUNS/demo_sick" --json "$OUT/demo_sick.json"
}
s_demo_healthy() {
  step 04 demo_healthy "$LIM_DEMO" --report "$OUT/demo_healthy.json" --note "$DEMO_NOTE" -- \
    "${TD[@]}" demo --healthy --steps "$DEMO_STEPS" "${DEMO_WINDOW[@]}" --out "$RUNS/demo_healthy" \
    --json "$OUT/demo_healthy.json"
}
s_demo_fix() {
  step 05 demo_fix "$LIM_FIX" --report "$OUT/demo_fix.json" -- \
    "${TD[@]}" demo --fix --apply safe "${FIX_ARGS[@]}" --out "$RUNS/demo_fix" --json "$OUT/demo_fix.json"
}
s_analyze() {  # ID RUN
  step "$1" "analyze_$2" "$LIM_ANALYZE" --report "$REPORTS/analyze_$2.json" -- \
    "${TD[@]}" analyze "$RUNS/$2/traces" --json "$REPORTS/analyze_$2.json"
}
s_pathology() {  # CASE: the case under `torchdoctor run`, then `analyze` of its trace
  local i
  case "$1" in
    cpu_module) i=10 ;; fp32_matmul) i=12 ;; unpinned_copy) i=14 ;; item_sync) i=16 ;; unfused_adamw) i=18 ;;
    *) echo "gpu_check: unknown pathology $1" >&2; return 0 ;;  # no step id to reuse
  esac
  step "$i" "path_$1" "$LIM_PATH" --report "$REPORTS/path_$1.json" -- \
    "${TD[@]}" run --profile-steps "$PATH_WINDOW" --out "$RUNS/path_$1" --json "$REPORTS/path_$1.json" \
    -- "$PY" benchmarks/gpu_pathologies.py --case "$1" "${PATH_ARGS[@]}"
  s_analyze $((i + 1)) "path_$1"
}
s_overhead() {
  step 20 overhead "$LIM_OVERHEAD" --report "$OUT/overhead.json" -- \
    "$PY" benchmarks/probe_overhead.py "${OVERHEAD_ARGS[@]}" --out "$OUT/overhead.json"
}

# Two lanes of about equal length (a dry run on 2 cores: much of a step is start-up and waiting).
lane_a() { s_demo_sick; s_demo_fix; s_analyze 06 demo_sick; s_pathology cpu_module; s_pathology fp32_matmul; }
lane_b() {
  s_demo_healthy; s_analyze 07 demo_healthy; s_overhead; s_pathology unpinned_copy; s_pathology item_sync
  s_pathology unfused_adamw
}

echo "[gpu_check] mode $MODE, python $PY, out $OUT, work $WORK, budget ${BUDGET_S} s, lanes $LANES"
s_env
s_wheels
if [ "$LANES" -ge 2 ]; then
  lane_a &
  lane_a_pid=$!
  lane_b
  wait "$lane_a_pid"
else
  s_demo_sick; s_demo_healthy; s_demo_fix
  s_analyze 06 demo_sick; s_analyze 07 demo_healthy
  for case in "${CASES[@]}"; do s_pathology "$case"; done
  s_overhead
fi

# Bundle: reports that are not in OUT_DIR, the run directories' facts and logs, then the traces,
# smallest first, while the archive stays under 15 MiB (the limit is 16 MiB a file).
cat >"$WORK/bundle.py" <<'EOF'
import os
import sys
import tarfile

work, dest = sys.argv[1], sys.argv[2]
budget = 15 * 2**20
files = []
for root, _dirs, names in os.walk(work):
    for n in names:
        path = os.path.join(root, n)
        rel = os.path.relpath(path, work)
        if rel.startswith(("steps", "logs")) or rel.endswith(".py") or not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        if rel.endswith((".json.gz", ".json.gz.tmp")):
            rank = 3
        elif rel.startswith("reports") or n == "run.json":
            rank = 0
        elif n.endswith(".json"):
            rank = 1
        else:
            rank = 2
        files.append((rank, size, rel))
files.sort()
used, kept, left = 0, [], []
for rank, size, rel in files:
    if used + size + 1024 > budget or (rank == 2 and size > 2**20):
        left.append(f"{rel} ({size} bytes)")
        continue
    used += size + 1024
    kept.append(rel)
with tarfile.open(dest, "w:gz") as tar:
    for rel in kept:
        tar.add(os.path.join(work, rel), arcname=os.path.join("gpu_check", rel))
print(f"{dest}: {len(kept)} files ({used} bytes before compression), {os.path.getsize(dest)} bytes")
for rel in kept:
    print(f"  + {rel}")
for item in left:
    print(f"  left out: {item}")
EOF
step 90 bundle 60 --final -- "$PY" "$WORK/bundle.py" "$WORK" "$OUT/gpu_check.tar.gz"

# steps.log: every step's command and output (each tail-capped at 512 KiB).
{
  for rec in "$WORK"/steps/*.rec; do
    base=$(basename "$rec" .rec)
    echo "===== $base: $(grep -E '^(rc|wall)=' "$rec" | tr '\n' ' ')"
    grep '^command=' "$rec"
    tail -c 524288 "$WORK/logs/$base.log"
    echo
  done
} >"$OUT/steps.log"

cat >"$WORK/summary.py" <<'EOF'
import glob
import json
import os
import sys

work, out, mode, total, pre = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])


def rec(path):
    d = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            d.setdefault(k, v)
    return d


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def facts_note(r):
    """Where the ranks ran: the probe's facts (live runs), else the trace's device name."""
    seen = []
    for rank in r.get("ranks") or []:
        facts = rank.get("facts")
        if facts is not None:
            dev = facts.get("device") or {}
            text = dev.get("kind") or "cpu"
            text += f" {dev['name']}" if dev.get("name") else ""
            text += f" ({facts['distributed_backend']})" if facts.get("distributed_backend") else ""
        else:
            text = rank.get("device") or "a CPU-only trace"
        if text not in seen:
            seen.append(text)
    return (f"{len(r.get('ranks') or [])} rank(s) on " + ", ".join(seen)) if seen else "no rank analysed"


def describe(name, d):
    report, notes, top = d.get("report"), [], ""
    r = load(report) if report else None
    if report and r is None:
        notes.append(f"no readable report {os.path.basename(report)}")
    elif r is not None and name == "overhead":
        top = "-"
        notes.append(f"overhead {r.get('overhead_pct')}% (95% bound {r.get('overhead_pct_upper_95')}%), "
                     f"{r.get('median_plain')} vs {r.get('median_probe')} steps/s, "
                     f"micro {r.get('micro_cost_us_per_step')} us/step")
    elif r is not None:
        top = ", ".join(f"{f['id']} ({f['severity']}, {f.get('recoverable_pct', 0):.0f}%)"
                        for f in (r.get("findings") or [])[:3]) or "no finding"
        if name.startswith(("path_", "analyze_path_")):
            case = name.split("path_", 1)[1]
            want = {"cpu_module": "HO-11", "fp32_matmul": "HW-1", "unpinned_copy": "DL-4", "item_sync": "HO-3",
                    "unfused_adamw": "HO-18"}[case]
            ids = [f["id"] for f in r.get("findings") or []]
            where = " on a GPU" if mode.startswith("dry") else ""
            notes.append(f"expects {want}{where}: {'found' if want in ids else 'absent'}")
        if r.get("ab"):
            ab = r["ab"]
            kept = [x["id"] for x in ab.get("remedies") or [] if x.get("kept")]
            loss = ((ab.get("details") or {}).get("loss_check") or {}).get("status")
            notes.append(f"speedup x{ab.get('speedup_median')}, kept {', '.join(kept) or 'none'}, loss {loss}")
        notes.append(facts_note(r))
    if d.get("note"):
        notes.append(d["note"])
    if d["rc"] in ("124", "137"):
        notes.insert(0, f"TIMED OUT after {d['limit']} s")
    elif d["rc"] == "125":
        notes.insert(0, "SKIPPED: time budget spent")
    return top, "; ".join(n for n in notes if n)


rows, failed = [], []
for path in sorted(glob.glob(os.path.join(work, "steps", "*.rec"))):
    d = rec(path)
    top, note = describe(d["name"], d)
    rows.append(f"| {d['name']} | {d['rc']} | {d['wall']} | {top} | {note} |")
    if d["rc"] != "0":
        failed.append(d["name"])
files = sorted(glob.glob(os.path.join(out, "**"), recursive=True))
files = [f for f in files if os.path.isfile(f)]
sizes = {os.path.relpath(f, out): os.path.getsize(f) for f in files}
lines = [
    f"# gpu_check summary ({mode})",
    "",
    "| step | rc | wall s | top findings | notes |",
    "|---|---|---|---|---|",
    *rows,
    "",
    f"{len(rows)} steps, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
    f"total {total:.0f} s.",
    f"OUT_DIR {out}: {len(sizes) + (0 if 'summary.md' in sizes else 1)} files, largest "
    f"{max(sizes.values(), default=0) / 2**20:.2f} MiB"
    + (f" (it already held {pre} entries before this run)" if pre else "") + ".",
]
with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
END_S=$(date +%s)
echo
timeout -k 5 60 "$PY" "$WORK/summary.py" "$WORK" "$OUT" "$MODE" "$((END_S - START_S))" "$PRE_EXISTING" \
  || { echo "gpu_check: summary failed" >&2; exit 1; }
failed=0
for rec in "$WORK"/steps/*.rec; do
  grep -qx 'rc=0' "$rec" || failed=1
done
exit "$failed"
