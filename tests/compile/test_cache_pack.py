"""Compile caches across machines: `run` records them, `cache pack` carries them, `run --cache` starts
warm from them in an empty cache directory, a damaged or foreign pack is refused in one line and the
job compiles cold, and `cache diff` names the field that differs (compile/cachepack.py,
compile/fingerprint.py, probe/compile_cache.py, CG-7)."""

from __future__ import annotations

import json
import subprocess
import zipfile

from probe.livejob import PY, env, facts_of, run, script, wrapper_cmd

JOB = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
# One small graph compiled by Inductor (a C++ kernel on a CPU), the rest eager: a short test.
metric = torch.compile(lambda y: (y.detach() * y.detach()).mean() + y.detach().abs().max())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16)
for _ in range(4):
    out = model(x)
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    metric(out)
print("ok")
"""


def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "torchdoctor.cli", "cache", *args], env=env(**extra), capture_output=True,
                          text=True, timeout=600)


def compiled_run(tmp_path, name: str, cache_dir, *options: str, **extra: str) -> dict:
    job = tmp_path / "job.py"
    if not job.exists():
        script(tmp_path, JOB)
    result = run(wrapper_cmd(tmp_path / name, [PY, str(job)], "--profile-steps", "off", *options),
                 TORCHINDUCTOR_CACHE_DIR=str(cache_dir), **extra)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    return {"facts": facts_of(tmp_path / name)["compile"], "stderr": result.stderr}


def test_a_pack_carries_the_caches_to_an_empty_directory_and_a_bad_one_is_refused(tmp_path):
    cold = compiled_run(tmp_path, "cold", tmp_path / "cache_a")["facts"]
    assert cold["cache_counts"].get("fx_graph.miss", 0) >= 1 and not cold["cache_counts"].get("fx_graph.hit")
    assert cold["cache_dir"] == str(tmp_path / "cache_a") and cold["cache_dir_default"] is False
    record = json.loads((tmp_path / "cold" / "caches" / "rank0.json").read_text())
    assert record["fingerprint"]["torch"].startswith("2.") and record["megacache"] == "rank0.megacache.bin"
    (graph,) = record["graphs"]  # the one compiled function, hashed without its device
    assert cold["graph_hashes"] == [graph["hash"]] and graph["nodes"][0] == "input float32[8,1]"
    # What Inductor made of it, in the run's report: one C++ kernel fusing the metric's ops, from its line.
    from torchdoctor.session import report_from_run_dir

    inductor = next(r.compile["inductor"] for r in report_from_run_dir(str(tmp_path / "cold")).ranks if r.compile)
    ((kernel,),) = [m["kernels"] for m in inductor["modules"]]
    assert kernel["name"].startswith("cpp_fused_") and {"abs", "mean", "mul"} <= set(kernel["aten"])
    assert kernel["lines"] == [f"{tmp_path / 'job.py'}:7"] and inductor["summary"].endswith("-> 1 generated kernel(s) + 0 extern call(s)")

    pack = tmp_path / "pack.zip"
    made = cli("pack", str(tmp_path / "cold"), str(pack))
    assert made.returncode == 0, made.stderr
    with zipfile.ZipFile(pack) as z:
        kernels = [n for n in z.namelist() if n.startswith("kernels/")]
        manifest = json.loads(z.read("manifest.json"))
    assert any(n.endswith(".so") for n in kernels) and manifest["fingerprint"] == record["fingerprint"]

    # A fresh, empty cache directory: every graph comes from the pack.
    warm = compiled_run(tmp_path, "warm", tmp_path / "cache_b", "--cache", str(pack))["facts"]
    assert warm["cache_counts"].get("fx_graph.hit", 0) == cold["cache_counts"]["fx_graph.miss"]
    assert not warm["cache_counts"].get("fx_graph.miss") and warm["cache_pack"].startswith("loaded ")
    assert warm["backend_s"] < cold["backend_s"]
    assert warm["graph_hashes"] == cold["graph_hashes"]
    same = cli("diff", str(tmp_path / "cold"), str(tmp_path / "warm"))
    assert same.returncode == 0 and "same environment" in same.stdout, same.stdout + same.stderr
    assert "same 1 graph(s)" in same.stdout

    # A truncated pack: one line, the job runs without it; under another key tag every FX graph
    # lookup misses (the first run's directory, whose content-addressed C++ kernels keep the test
    # short), and diff names the tag.
    broken = tmp_path / "broken.zip"
    broken.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])
    third = compiled_run(tmp_path, "third", tmp_path / "cache_a", "--cache", str(broken),
                         "--json", str(tmp_path / "third.json"), TORCH_COMPILE_CACHE_KEY_TAG="ci-b")
    refused = [line for line in third["stderr"].splitlines() if "cache pack not loaded" in line]
    assert len(refused) == 1 and str(broken) in refused[0], third["stderr"]
    assert third["facts"]["cache_counts"].get("fx_graph.miss", 0) >= 1 and not third["facts"]["cache_counts"].get("fx_graph.hit")
    assert third["facts"].get("cache_pack") is None  # refused by the wrapper: no rank was asked to load it
    differs = cli("diff", str(tmp_path / "cold"), str(tmp_path / "third"))
    assert differs.returncode == 1 and "env.TORCH_COMPILE_CACHE_KEY_TAG: (unset) -> ci-b" in differs.stdout
    assert "compiler.cache_key_tag: '' -> 'ci-b' (invalidates fx_graph" in differs.stdout
    # The run's own report names it too: the first run filled this cache directory (CG-8).
    cg8 = next(f for f in json.loads((tmp_path / "third.json").read_text())["findings"] if f["id"] == "CG-8")
    assert "previous run in this cache directory (cold)" in cg8["title"] and "cache_key_tag" in cg8["title"]
    assert "same TORCH_COMPILE_CACHE_KEY_TAG" in cg8["fix"]["text"]

    # A pack from another torch: `cache load` refuses it, naming the field, and loads nothing.
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(pack) as src, zipfile.ZipFile(foreign, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item == "manifest.json":
                m = json.loads(data)
                m["fingerprint"]["torch"] = "1.13.0"
                data = json.dumps(m).encode()
            dst.writestr(item, data)
    out = cli("load", str(foreign), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache_d"))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "made for another environment: torch: 1.13.0 -> " in out.stderr
    assert not (tmp_path / "cache_d").exists() or not any((tmp_path / "cache_d").iterdir())
    assert cli("load", str(tmp_path / "job.py")).returncode == 2
