"""Compile-layer rules (CG-1..CG-6)."""

from __future__ import annotations

import msgspec
import pytest

from torchdoctor.facts import BackendFacts, CompileFacts, GraphBreakFacts, RecompileFacts
from torchdoctor.metrics.model import KindTime
from torchdoctor.rules.compile_breaks import advice, kind_of

from .conftest import MS, gpu_facts, gpu_result, only, run


def eager(count_per_step=1000, ms_per_step=30.0):
    r = gpu_result(busy=90.0)
    r.kernels.by_kind = [KindTime("elementwise", int(ms_per_step * 5 * MS), count_per_step * 5, 30.0)]
    return r


def test_cg1_eager_pointwise_suggests_compile_as_info():
    got = only(run("CG-1", (eager(), None)), "CG-1")
    assert got.severity == "info" and got.remedy == "compile"
    assert abs(got.recoverable_ms - 30.0 / 3 * 0.9) < 1e-6  # a third, scaled by the busy share


def test_cg1_silent_when_compiled():
    r = eager()
    r.compile_regions = {"0/0": 5}
    assert run("CG-1", (r, None)) == []
    assert run("CG-1", (eager(count_per_step=10), None)) == []


def test_cg1_prices_only_the_kernels_aten_launched():
    # A custom extension's hand-fused kernels are most of the pointwise time; compiling fuses
    # only what ATen launched (10 ms of the 30).
    r = eager()
    r.kernels.eager_fusable = KindTime("eager_fusable", int(10.0 * 5 * MS), 500 * 5, 10.0)
    got = only(run("CG-1", (r, None)), "CG-1")
    assert abs(got.recoverable_ms - 10.0 / 3 * 0.9) < 1e-6
    assert "500 ATen pointwise/reduction kernels per step" in got.title
    r.kernels.eager_fusable = KindTime("eager_fusable", int(1.0 * 5 * MS), 50 * 5, 1.0)
    assert run("CG-1", (r, None)) == []  # too few to matter


def test_cg2_graph_breaks():
    f = gpu_facts(compile=CompileFacts(used=True, graph_breaks=3, graph_break_reasons=["Tensor.item"]))
    got = only(run("CG-2", (None, f)), "CG-2")
    assert got.severity == "warning" and "3 time" in got.title


BREAKS = [
    GraphBreakFacts("Failed to trace builtin operator", gb_id="GB0059",
                    explanation="Dynamo does not know how to trace builtin operator `print` with argument types ['str']",
                    location="/job/train.py:21", source='print("loss", loss)', function="forward", compiles=3),
    GraphBreakFacts("Unsupported Tensor.item() call with capture_scalar_outputs=False", gb_id="GB0124",
                    location="/job/train.py:22", source="scale = h.mean().item()", function="forward"),
    GraphBreakFacts("Data-dependent branching", gb_id="GB0170", location="/job/train.py:19",
                    source="if h.sum() > 0:", function="forward"),
    GraphBreakFacts("Attempted to call function marked as skipped", gb_id="GB0007",
                    location="/job/train.py:25", source="y = scipy_fn(h)", function="forward"),
    GraphBreakFacts("Skip calling `torch.compiler.disable()`d function", gb_id="GB0098",
                    location="/job/train.py:27", source="h = debug_hook(h)", function="forward"),
    GraphBreakFacts("DDPOptimizer split the graph at a bucket boundary", location="/job/train.py:30"),
    GraphBreakFacts("Call to `torch._dynamo.graph_break()`", gb_id="GB0025", location="/job/train.py:38",
                    source="opt.step()", function="train_step", in_torch=True),
    GraphBreakFacts("Some new break type", hints=["Do the registry's thing."], location="/job/train.py:40"),
]


def test_cg2_names_each_break_at_the_users_line_with_its_fix():
    f = gpu_facts(compile=CompileFacts(used=True, graph_breaks=8, breaks=BREAKS))
    got = only(run("CG-2", (None, f)), "CG-2")
    assert "train.py:21, train.py:22, train.py:19, train.py:25 and 4 more" in got.title
    items = [e.items[0] for e in got.evidence[1:]]
    assert [i["kind"] for i in items] == ["logging", "scalar", "branch", "unsupported", "disabled", "ddp", "torch", "other"]
    assert [i["fix"] for i in items] == [advice(b)[0] for b in BREAKS]
    assert items[-1]["fix"] == "Do the registry's thing."
    first = got.evidence[1].text
    assert "/job/train.py:21 in forward(): `print(\"loss\", loss)`" in first and "[GB0059]" in first and "3x" in first
    assert "torch.where" in got.fix.snippet and "capture_scalar_outputs" in got.fix.snippet
    assert "reorderable_logging_functions" in got.fix.snippet and "allow_in_graph" in got.fix.snippet
    assert "train.py:19: Express the Python `if`" in got.fix.text and "/job/train.py:38" not in got.fix.text


def test_cg2_breaks_inside_torch_only_are_expected():
    f = gpu_facts(compile=CompileFacts(used=True, graph_breaks=1, breaks=[BREAKS[6]]))
    got = only(run("CG-2", (None, f)), "CG-2")
    assert got.fix.text.startswith("The break is inside torch's own code") and got.fix.snippet == ""


def test_cg2_breaks_all_in_a_library_say_so_and_hints_end_as_sentences():
    """torchvision's Faster R-CNN broke at 13 lines, all torchvision's: Dynamo's hints end without a
    full stop and ran together; the fix also says whose lines they are (judged over every break,
    not the 8 shown)."""
    site = "/venv/lib/python3.11/site-packages/torchvision/ops/boxes.py"
    lib = [GraphBreakFacts("Dynamic shape operator", gb_id="GB0036", location=f"{site}:{100 + i}",
                           hints=["Enable tracing of dynamic shape operators with "
                                  "`torch._dynamo.config.capture_dynamic_output_shape_ops = True`"]) for i in range(9)]
    got = only(run("CG-2", (None, gpu_facts(compile=CompileFacts(used=True, graph_breaks=9, breaks=lib)))), "CG-2")
    assert "capture_dynamic_output_shape_ops = True`." in got.fix.text
    assert got.fix.text.endswith("(Every break is in torchvision's code, not the job's: the settings apply to it; a "
                                 "change to its lines would be the library's to make.)")
    mixed = [*lib[:8], GraphBreakFacts("Data-dependent branching", gb_id="GB0170", location="/job/train.py:19")]
    got = only(run("CG-2", (None, gpu_facts(compile=CompileFacts(used=True, graph_breaks=9, breaks=mixed)))), "CG-2")
    assert "Every break is in" not in got.fix.text  # the job's own line is the 9th, past the 8 shown


def test_cg2_silent_without_breaks():
    assert run("CG-2", (None, gpu_facts(compile=CompileFacts(used=True, graph_breaks=0)))) == []


def test_cg2_functions_compiled_apart_are_not_breaks():
    """torchtune with compile=True compiles each layer and the loss: two frames in every step (0/1 and 1/1)
    while Dynamo counted no break. A trace alone cannot tell them from a break, and says both."""
    r = gpu_result()
    r.compile_regions = {"0/1": 12, "1/1": 8}
    assert run("CG-2", (r, gpu_facts(compile=CompileFacts(used=True, graph_breaks=0)))) == []
    got = only(run("CG-2", (r, None)), "CG-2")
    assert got.title.startswith("The step runs 2 compiled frames: graph breaks between them, or functions compiled "
                                "apart"), got.title
    assert (got.severity, got.confidence, got.recoverable_ms) == ("info", "low", 0.0)
    assert "TORCH_LOGS=graph_breaks" in got.fix.snippet and "fullgraph" not in got.fix.text
    # Facts that cannot tell: a frame Dynamo resumed after a break, or a probe that saw no compile.
    resumed = CompileFacts(used=True, graph_breaks=0, frame_names={"1": "torch_dynamo_resume_in_forward_at_42"})
    assert only(run("CG-2", (r, gpu_facts(compile=resumed))), "CG-2").severity == "info"
    assert only(run("CG-2", (r, gpu_facts(compile=CompileFacts(used=False, graph_breaks=0)))), "CG-2")


STORM = RecompileFacts("forward", location="/job/model.py:6", count=7,
                       guard="tensor 'x' size mismatch at index 1. expected 70, actual 71", kind="size",
                       tensor="x", dim=1, values=["64", "65", "66", "67", "68", "69", "70", "71", "72"],
                       limit_hit=True, compile_s=3.5)


def test_cg3_recompile_limit_is_critical_names_the_dimension_and_prices_the_job_not_the_step():
    f = gpu_facts(compile=CompileFacts(used=True, recompiles=7, recompile_frames=[STORM]), train_wall_s=70.0)
    got = only(run("CG-3", (None, f)), "CG-3")
    assert got.severity == "critical" and "gave up on forward after 7 recompile(s)" in got.title
    assert "input 'x' changes size at dim 1" in got.evidence[0].text and "64, 65" in got.evidence[0].text
    assert "torch._dynamo.mark_dynamic(x, 1)" in got.fix.snippet
    # A one-off cost: 3.5 s of a 70 s job, nothing claimed from the step.
    assert got.recoverable_pct == 0.0 and not got.claims and got.job_s == 3.5 and got.job_pct == 5.0


def test_cg3_one_recompile_is_info_a_changing_python_value_is_a_warning():
    once = RecompileFacts("forward", count=1, guard="tensor 'x' size mismatch at index 0. expected 4, actual 5",
                          kind="size", tensor="x", dim=0, values=["4", "5"], compile_s=0.2)
    f = gpu_facts(compile=CompileFacts(used=True, recompiles=1, recompile_frames=[once]))
    assert only(run("CG-3", (None, f)), "CG-3").severity == "info"
    value = RecompileFacts("scale", count=3, guard="s == 0.5", kind="value", tensor="s", values=["0.5", "1.5", "2.5"])
    got = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=3, recompile_frames=[value])))), "CG-3")
    assert got.severity == "warning" and "the Python value s changes (values seen: 0.5, 1.5, 2.5)" in got.evidence[0].text
    assert "s = torch.tensor(s)" in got.fix.snippet and got.job_s is None


def test_cg3_an_evaluation_and_a_smaller_last_batch_are_two_causes_each_with_its_fix():
    """timm's train.py with --torchcompile: one recompile for the evaluation under no_grad, expected
    and left alone, and one for the last validation batch of 8, which mark_dynamic or padding avoids."""
    grad = RecompileFacts("forward", location="/timm/resnet.py:773", count=1, guard="GLOBAL_STATE changed: grad_mode",
                          kind="global_state", compile_s=0.9)
    size = RecompileFacts("forward", location="/timm/resnet.py:773", count=1,
                          guard="tensor 'x' size mismatch at index 0. expected 16, actual 8", kind="size", tensor="x",
                          dim=0, values=["16", "8"], compile_s=0.7)
    f = gpu_facts(compile=CompileFacts(used=True, recompiles=2, recompile_frames=[grad, size]), train_wall_s=9.0)
    got = only(run("CG-3", (None, f)), "CG-3")
    assert got.severity == "info", got.severity  # once each: neither recurs
    assert got.title.startswith("torch.compile recompiled 2 time(s) (grad mode changed: a forward under no_grad, an "
                                "evaluation, compiles a graph of its own; input 'x' changes size at dim 0)"), got.title
    assert got.job_s == 1.6 and len(got.evidence) == 2
    assert "forward: Expected once: the evaluation's graph is compiled at its first call" in got.fix.text
    assert "forward: Mark the dimension dynamic" in got.fix.text and "Sizes seen: 8, 16." in got.fix.text
    assert got.fix.snippet.startswith("torch._dynamo.mark_dynamic(x, 0)")
    # The same cause again and again is no longer "expected once".
    again = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(
        used=True, recompiles=3, recompile_frames=[RecompileFacts(**{**msgspec.structs.asdict(grad), "count": 3})])))),
        "CG-3")
    assert again.severity == "warning" and "Expected once" not in again.fix.text
    assert "compile training and evaluation as separate functions" in again.fix.text


def test_cg3_counts_and_judges_a_frame_over_all_its_causes():
    """One entry per cause: the recompile limit's count, the severity and the fix's frame names are
    still the frame's."""
    value = RecompileFacts("forward", location="/m.py:3", count=3, guard="n == 2", kind="value", tensor="n",
                           values=["1", "2", "3"], compile_s=0.3)
    size = msgspec.structs.replace(STORM, count=5, location="/m.py:3", limit_hit=True)
    facts = gpu_facts(compile=CompileFacts(used=True, recompiles=8, recompile_frames=[size, value]))
    got = only(run("CG-3", (None, facts)), "CG-3")
    assert "gave up on forward after 8 recompile(s)" in got.title, got.title
    # Six inputs that each changed once: the frame recompiled six times, a warning.
    sizes = [RecompileFacts("forward", location="/m.py:3", count=1, guard=f"tensor 'x{i}' size mismatch at index 0. "
                            "expected 4, actual 5", kind="size", tensor=f"x{i}", dim=0, values=["4", "5"])
             for i in range(6)]
    got = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=6, recompile_frames=sizes)))),
               "CG-3")
    assert got.severity == "warning"
    assert got.fix.text.startswith("forward: Mark the dimension dynamic") and "forward, forward" not in got.fix.text


def test_cg3_a_dynamic_dimension_that_is_0_or_1_is_named_with_its_fix():
    """torchvision's Faster R-CNN: an image with one box failed `2 <= targets[1]['boxes'].size()[0]`,
    the guard of a dimension already dynamic (Dynamo compiles sizes 0 and 1 apart): "a guard failed"
    told nothing."""
    one_box = RecompileFacts("forward", location="/tv/roi_heads.py:739", count=5, kind="size",
                             guard="2 <= targets[1]['boxes'].size()[0]", tensor="targets[1]['boxes']", dim=0)
    got = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=5, recompile_frames=[one_box])))),
               "CG-3")
    assert "(input 'targets[1]['boxes']' changes size at dim 0 (to 0 or 1 on some calls))" in got.title, got.title
    assert "0/1 specialization" in got.fix.text and "Mark the dimension dynamic" not in got.fix.text
    assert got.fix.snippet.startswith("torch._dynamo.decorators.mark_unbacked(targets[1]['boxes'], 0)")


def test_cg3_a_dynamic_dimension_pinned_to_a_value_is_the_codes_doing():
    """`L['x'].size()[1] == 64` fails on a dimension already dynamic: code specialized it (an int() of
    the size); mark_dynamic would not help. An upper bound's failure is no 0/1 specialization."""
    pin = RecompileFacts("forward", count=2, kind="size", guard="L['x'].size()[1] == 64", tensor="x", dim=1,
                         values=["64", "65", "66"])
    got = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=2, recompile_frames=[pin])))),
               "CG-3")
    assert "pins it to one value (L['x'].size()[1] == 64)" in got.fix.text and "mark_dynamic" not in got.fix.snippet
    assert "TORCH_LOGS=+dynamic" in got.fix.snippet and "(values seen: 64, 65, 66)" in got.evidence[0].text
    bounded = msgspec.structs.replace(pin, guard="2 <= x.size()[0] <= 8", dim=0, values=[])
    got = only(run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=2, recompile_frames=[bounded])))),
               "CG-3")
    assert "0/1 specialization" not in got.fix.text and "to 0 or 1" not in got.title


def test_cg3_frames_of_a_library_are_told_dynamic_true_together():
    """torchvision's Faster R-CNN: box_iou and the Matcher recompiled for each new box count, functions the
    job never calls itself, so mark_dynamic(boxes1, 0) had no line of the job's to go on; one snippet."""
    site = "/venv/lib/python3.11/site-packages/torchvision/"
    iou = RecompileFacts("box_iou", location=site + "ops/boxes.py:271", count=4, kind="size",
                         guard="tensor 'boxes1' size mismatch at index 0. expected 2, actual 3", tensor="boxes1",
                         dim=0, values=["1", "2", "3"])
    matcher = RecompileFacts("__call__", location=site + "models/detection/_utils.py:363", count=3, kind="size",
                             guard="tensor 'match_quality_matrix' size mismatch at index 0. expected 2, actual 3",
                             tensor="match_quality_matrix", dim=0, values=["1", "2", "3"])
    own = RecompileFacts("forward", location="/job/train.py:30", count=2, kind="size",
                         guard="tensor 'x' size mismatch at index 0. expected 8, actual 4", tensor="x", dim=0,
                         values=["4", "8"])
    facts = gpu_facts(compile=CompileFacts(used=True, recompiles=9, recompile_frames=[iou, matcher, own]))
    got = only(run("CG-3", (None, facts)), "CG-3")
    assert ("box_iou, __call__: torchvision's own code, called from inside torchvision: the job has no line where "
            "its input could be marked dynamic") in got.fix.text
    assert "Sizes 0 and 1 still compile apart" in got.fix.text
    lines = got.fix.snippet.splitlines()
    assert lines.count("model = torch.compile(model, dynamic=True)   # sizes dynamic from the first compile") == 1
    assert any(line.startswith("torch._dynamo.mark_dynamic(x, 0)") for line in lines)  # the job's own frame


def test_cg3_trace_only_variants_are_info_and_silent_without_recompiles():
    r = gpu_result()
    r.compile_regions = {"0/0": 5, "0/1": 5}
    got = only(run("CG-3", (r, None)), "CG-3")
    assert got.severity == "info" and "0/1" in got.title
    assert run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=0)))) == []


def test_cg6_compile_time_is_a_job_share_never_a_step_share():
    c = CompileFacts(used=True, compile_time_s=24.0, dynamo_s=0.5, backend_s=23.5, cache_hits=0, cache_misses=2,
                     unique_graphs=1)
    got = only(run("CG-6", (None, gpu_facts(compile=c, train_wall_s=96.0))), "CG-6")
    assert got.severity == "info" and got.recoverable_pct == 0.0 and not got.claims
    assert got.job_s == 24.0 and got.job_pct == 25.0
    assert "24.0 s of compiling, 25% of the job's 96 s so far" in got.title and "Inductor) 23.5 s" in got.title
    ended = only(run("CG-6", (None, gpu_facts(compile=c, train_wall_s=96.0, ended="exit"))), "CG-6")
    assert "25% of the job's 96 s of training" in ended.title  # timm's finished job read "so far"
    assert "0 hit(s), 2 miss(es)" in got.evidence[0].text
    unknown = only(run("CG-6", (None, gpu_facts(compile=c))), "CG-6")
    assert unknown.job_pct is None and "wall time is unknown" in unknown.title
    assert run("CG-6", (None, gpu_facts(compile=CompileFacts(used=True)))) == []


def test_cg7_a_cold_start_in_the_default_cache_directory():
    def facts(**kw):
        c = CompileFacts(used=True, compile_time_s=30.0, dynamo_s=6.0, backend_s=24.0,
                         cache_counts={"fx_graph.miss": 2, "aot_autograd.miss": 1}, cache_dir="/tmp/torchinductor_ci",
                         cache_dir_default=True)
        for k, v in kw.items():
            setattr(c, k, v)
        return gpu_facts(compile=c, train_wall_s=120.0)

    got = only(run("CG-7", (None, facts())), "CG-7")
    # The backend's 24 s (what warm caches skip) of a 120 s job: 20%, a warning; no step claimed.
    assert got.severity == "warning" and got.job_s == 24.0 and got.job_pct == 20.0 and not got.claims
    assert "2 FX graph cache miss(es), no hit" in got.title and "/tmp/torchinductor_ci" in got.title
    assert "torchdoctor run --cache" in got.fix.snippet
    assert run("CG-7", (None, facts(cache_dir_default=False))) == []  # a directory the user chose: it persists
    assert run("CG-7", (None, facts(cache_counts={"fx_graph.miss": 1, "fx_graph.hit": 1}))) == []
    refused = only(run("CG-7", (None, facts(cache_dir_default=False, cache_pack="refused: p.zip: truncated"))), "CG-7")
    assert "The cache pack was refused (p.zip: truncated)" in refused.title
    small = facts(backend_s=2.0)  # 2 s of a 120 s job: not worth a line
    assert run("CG-7", (None, small)) == []


def test_cg8_names_what_changed_since_the_run_that_filled_the_cache():
    from torchdoctor.rules import load_all
    from torchdoctor.rules.engine import REGISTRY

    from .conftest import inputs

    load_all()
    c = CompileFacts(used=True, compile_time_s=30.0, dynamo_s=6.0, backend_s=24.0, cache_counts={"fx_graph.miss": 2},
                     cache_dir="/tmp/torchinductor_ci", cache_dir_default=True)
    inp = inputs((None, gpu_facts(compile=c, train_wall_s=120.0)))
    inp.run = {"dir": "td-runs/b", "compile_cache": {
        "previous": "td-runs/a", "cache_dir": "/tmp/torchinductor_ci", "fields": ["threads"], "graphs": "same",
        "changed": ["threads: 2 -> 1 (invalidates fx_graph, aot_autograd, dynamo)"]}}
    (got,) = REGISTRY["CG-8"](inp)
    assert got.severity == "warning" and got.job_s == 24.0 and not got.claims
    assert "previous run in this cache directory (a) compiled into it: changed since then: threads: 2 -> 1" in got.title
    assert "TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1" in got.fix.text and got.fix.snippet == "torchdoctor cache diff td-runs/a td-runs/b"
    assert list(REGISTRY["CG-7"](inp)) == []  # the more specific CG-8 speaks


def test_cg4_cudagraph_skips():
    f = gpu_facts(compile=CompileFacts(used=True, cudagraph_skips=2))
    assert only(run("CG-4", (None, f)), "CG-4").remedy == "cudagraphs"


def test_cg4_silent_without_skips():
    assert run("CG-4", (None, gpu_facts())) == []


def test_cg5_cudnn_benchmark_off_for_convs():
    r = gpu_result(busy=100.0)
    r.signals.conv_ns = 50 * 5 * MS
    f = gpu_facts(backends=BackendFacts(cudnn_benchmark=False))
    got = only(run("CG-5", (r, f)), "CG-5")
    assert got.remedy == "cudnn.benchmark" and abs(got.recoverable_ms - 5.0) < 1e-6


def test_cg5_silent_when_on_or_without_convs():
    r = gpu_result()
    assert run("CG-5", (r, gpu_facts(backends=BackendFacts(cudnn_benchmark=False)))) == []  # no convolutions
    r.signals.conv_ns = 50 * 5 * MS
    assert run("CG-5", (r, gpu_facts(backends=BackendFacts(cudnn_benchmark=True)))) == []


def test_cg2_prices_each_break_by_the_eager_gap_before_its_resume_function():
    """The trace's gap before region 1/0 belongs to the break whose resume function (frame 1) is
    torch_dynamo_resume_in_forward_at_21: BREAKS[0], at train.py:21."""
    r = gpu_result()
    r.compile_regions = {"0/0": 5, "1/0": 5}
    r.compile_gaps_ms = {"1/0": 0.75}
    f = gpu_facts(compile=CompileFacts(used=True, graph_breaks=1, breaks=BREAKS[:1],
                                       frame_names={"0": "forward", "1": "torch_dynamo_resume_in_forward_at_21"}))
    got = only(run("CG-2", (r, f)), "CG-2")
    assert "750 µs per step" in got.title or "0.75 ms per step" in got.title, got.title
    brk = got.evidence[1]
    assert brk.values["eager_ms_per_step"] == 0.75 and brk.items[0]["location"] == "/job/train.py:21"
    f.compile.frame_names = {"1": "torch_dynamo_resume_in_forward_at_99"}  # another line: not this break's
    assert only(run("CG-2", (r, f)), "CG-2").evidence[1].values["eager_ms_per_step"] is None


def test_cg2_a_compiled_training_step_is_told_to_compile_the_model_instead():
    """pytorch/tutorials' torch_compile_full_example compiles train(): zero_grad, forward, backward, step.
    The breaks at zero_grad (skipped on purpose) and backward were told 'allow_in_graph' and
    'trace_autograd_ops=True'; inside opt.step() they stay torch's own, expected."""
    breaks = [
        GraphBreakFacts("Attempted to call function marked as skipped", gb_id="GB0007", location="/job/t.py:22",
                        source="opt.zero_grad(True)", function="train"),
        GraphBreakFacts("Unsupported Tensor.backward() call", gb_id="GB0123", location="/job/t.py:25",
                        source="loss.backward()", function="train",
                        hints=["Set torch._dynamo.config.trace_autograd_ops=True"]),
        GraphBreakFacts("Call to `torch._dynamo.graph_break()`", gb_id="GB0025", location="/job/t.py:26",
                        source="opt.step()", function="train", in_torch=True),
    ]
    assert [kind_of(b) for b in breaks] == ["train_step", "train_step", "torch"]
    got = only(run("CG-2", (None, gpu_facts(compile=CompileFacts(used=True, graph_breaks=3, breaks=breaks)))), "CG-2")
    assert got.fix.text.startswith("t.py:22, t.py:25: The compiled function runs the whole training step")
    assert "allow_in_graph" not in got.fix.snippet and "model.compile()" in got.fix.snippet
    assert "def opt_step():\n    opt.step()" in got.fix.snippet


@pytest.mark.parametrize(("source", "gb_id", "reason", "kind"), [
    ("loss.backward()", "GB0123", "Unsupported Tensor.backward() call", "train_step"),
    ("optimizer.zero_grad(set_to_none=True)", "GB0007", "Attempted to call function marked as skipped", "train_step"),
    ("scaler.step(opt)", "GB0025", "Call to `torch._dynamo.graph_break()`", "train_step"),
    # Not a training step: an RL environment's step reading a scalar, a diffusion scheduler's step.
    ("obs, r, done, _ = env.step(action.item())", "GB0124", "Unsupported Tensor.item() call", "scalar"),
    ("latents = self.scheduler.step(noise, t, latents)", "GB0007", "Attempted to call function marked as skipped",
     "unsupported"),
])
def test_cg2_train_step_breaks_are_the_optimizers_and_backwards_only(source, gb_id, reason, kind):
    b = GraphBreakFacts(reason, gb_id=gb_id, location="/job/t.py:9", source=source, function="train")
    assert kind_of(b) == kind
