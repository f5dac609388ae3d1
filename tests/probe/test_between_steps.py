"""Work between training steps (an RL rollout, an evaluation) measured live, and HO-16 on it."""

from __future__ import annotations

import json

import pytest

from probe.livejob import facts_of, probed_job, run_wrapped, script

# CleanRL's ppo.py in miniature: every 6 updates a rollout of policy forwards under no_grad and
# environment steps (sleeps: the time is deterministic), timed by the job itself.
JOB = """
import sys, time
import torch

torch.manual_seed(0)
policy = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
obs = torch.randn(4, 8)
between = 0.0
for iteration in range(8):
    t0 = time.perf_counter()
    for _ in range(20):  # the rollout
        with torch.no_grad():
            logits = policy(obs)  # ROLLOUT
        time.sleep(0.004)  # env.step
    between += time.perf_counter() - t0
    for _ in range(6):  # the update
        loss = policy(torch.randn(64, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(f"between {between:.4f}")
"""


def test_a_rollout_every_6_updates_is_measured_and_named(tmp_path):
    job = script(tmp_path, JOB)
    run_dir = tmp_path / "run"
    report_path = tmp_path / "r.json"
    result = run_wrapped(run_dir, job, options=("--profile-steps", "off", "--json", str(report_path)))
    assert result.returncode == 0, result.stderr
    between_s = float(result.stdout.split()[-1])
    facts = facts_of(run_dir)
    steps = {s["step"]: s for s in facts["steps"]}
    # Step k's interval holds the rollout that follows update k - 1 (every 6th step after step 0).
    rollouts = [k for k in steps if k >= 1 and k % 6 == 0]
    assert rollouts == [6, 12, 18, 24, 30, 36, 42]
    assert all(steps[k].get("inference_ms", 0.0) > 0 for k in rollouts)
    assert not any(s.get("inference_ms", 0.0) for k, s in steps.items() if k not in rollouts and k >= 1)
    line = next(i for i, t in enumerate(JOB.splitlines(), start=1) if "# ROLLOUT" in t)
    assert facts["inference_site"] == f"{job}:{line}" and facts["inference_mode"] is False
    ho16 = next(f for f in json.loads(report_path.read_text())["findings"] if f["id"] == "HO-16")
    assert ho16["title"].startswith("Every 6 steps the training loop stops for") and ho16["per"] == "job"
    assert ho16["recoverable_pct"] == 0 and ho16["severity"] == "critical"
    # The 7 rollouts after step 0 against the job's own timer of all 8 (80 ms of sleeps or more each).
    assert abs(ho16["job_s"] - between_s * 7 / 8) <= 0.15 * between_s * 7 / 8, (ho16["job_s"], between_s)
    values = ho16["evidence"][0]["values"]
    assert values["long_steps"] == 7 and values["every_steps"] == 6
    assert values["rest_ms"] > 80 * 0.9  # the sleeps: outside the model


# DQN's update in miniature: a target network's forward under no_grad in every update (part of
# the training step), and an evaluation of the trained network every 5 updates.
TARGET = """
import copy, time
import torch

torch.manual_seed(0)
q = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
target = copy.deepcopy(q)
opt = torch.optim.Adam(q.parameters(), lr=1e-3)
for step in range(40):
    x = torch.randn(64, 8)
    with torch.no_grad():
        goal = target(x).max(1).values  # TARGET
    loss = (q(x).max(1).values - goal).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 4:
        with torch.no_grad():
            q(torch.randn(512, 8))  # EVAL
        time.sleep(0.01)
print("ok")
"""


def test_a_target_networks_forward_is_the_steps_own_and_an_evaluation_is_not(tmp_path):
    result, facts, findings = probed_job(tmp_path, TARGET)
    assert result.stdout == "ok\n"
    steps = [s for s in facts["steps"] if s["step"] >= 1]
    # The target network's forward, in every step, is timed apart as frozen (it never trains).
    assert all(s.get("frozen_inference_ms", 0.0) > 0 for s in steps)
    # Step k's interval holds the evaluation after update k - 1: steps 5, 10, ... 35.
    evaluating = sorted(s["step"] for s in steps if s.get("inference_ms", 0.0) > s.get("frozen_inference_ms", 0.0))
    assert evaluating == [5, 10, 15, 20, 25, 30, 35], evaluating
    line = next(i for i, t in enumerate(TARGET.splitlines(), start=1) if "# EVAL" in t)
    assert facts["inference_site"] == f"{tmp_path / 'job.py'}:{line}"
    # Not "an evaluation after every training step": the target network's forward is the step's own.
    ho16 = [f for f in findings if f["id"] == "HO-16"]
    assert not any(f["title"].startswith("After every training step") for f in ho16), ho16


# OpenCLIP's --accum-freq in miniature (open_clip_train/train.py): each step draws 2 micro-batches,
# computes their features without autograd for a contrastive loss over all of them, then runs each
# again with autograd. And PyG's gcn.py in miniature: every step trains on the full graph and then
# evaluates that same graph: an evaluation after every step.
ACCUM = """
import time
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2048, 32)), batch_size=128)
batches = []
for (x,) in loader:
    with torch.no_grad():
        features = model(x)  # CACHE
    batches.append((x, features))
    if len(batches) < 2:
        continue
    opt.zero_grad()
    for j, (x, _) in enumerate(batches):
        others = torch.cat([f for k, (_, f) in enumerate(batches) if k != j])
        loss = (model(x) @ others.T).logsumexp(1).mean()
        loss.backward()
    opt.step()
    batches = []
print("ok")
"""

FULL_GRAPH = """
import torch

torch.manual_seed(0)
x = torch.randn(4096, 64)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for epoch in range(30):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        model(x)  # EVAL
print("ok")
"""


def test_a_forward_without_autograd_on_the_steps_own_micro_batch_is_the_steps_own(tmp_path):
    result, facts, findings = probed_job(tmp_path, ACCUM)
    assert result.stdout == "ok\n"
    # From step 2: the hooks, attached in step 0, have an earlier step's inputs to compare with.
    steps = [s for s in facts["steps"] if s["step"] >= 2]
    assert len(steps) >= 5
    # Every step's forwards without autograd took the micro-batches the step then trained on.
    assert all(s["inference_ms"] > 0 and s["frozen_inference_ms"] == s["inference_ms"] for s in steps), steps
    assert not [f for f in findings if f["id"] == "HO-16"]


def test_an_evaluation_of_the_data_every_step_trains_on_stays_an_evaluation(tmp_path):
    result, facts, findings = probed_job(tmp_path, FULL_GRAPH)
    assert result.stdout == "ok\n"
    # From step 2: in step 1 the model had not run with autograd under the hooks yet, so its first
    # evaluation reads as a frozen module's (a target network's).
    steps = [s for s in facts["steps"] if s["step"] >= 2]
    # Step k's interval holds the evaluation after update k - 1, then update k on the same x.
    assert all(s["inference_ms"] > 0 and s.get("frozen_inference_ms", 0.0) == 0.0 for s in steps), steps
    ho16 = [f for f in findings if f["id"] == "HO-16"]
    assert any(f["title"].startswith("After every training step") for f in ho16), [f["title"] for f in findings]


def test_an_input_without_memory_of_its_own_has_no_key_and_breaks_nothing():
    # torch.func's wrappers have no storage: data_ptr() raises. Recorded as a probe error, it would
    # have stopped the forward's timing for the rest of the job (a PINN that trains through vmap).
    import torch

    from torchdoctor.probe import hooks

    got = []

    def f(t):
        got.append(hooks._input_key(t))
        return t * 2

    torch.func.vmap(f)(torch.ones(2, 3))
    assert got == [None]
    assert hooks._input_key(torch.ones(2, 3)) is not None


# sentence-transformers' GISTEmbedLoss in miniature: the loss module holds the model and a guide run
# under no_grad, whose parameters require grad and sit in the optimizer (the trainer optimizes the
# loss's parameters) but never get a gradient; the job evaluates by calling the model itself.
GUIDED = """
import time
import torch

torch.manual_seed(0)


class GuidedLoss(torch.nn.Module):
    def __init__(self, model, guide):
        super().__init__()
        self.model, self.guide = model, guide

    def forward(self, x):
        with torch.no_grad():
            target = self.guide(x)
        return (self.model(x)[:, :8] - target).pow(2).mean()


model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
guide = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))  # requires grad
loss_fn = GuidedLoss(model, guide)
opt = torch.optim.SGD(loss_fn.parameters(), lr=1e-3)
if EVALUATE_FIRST:  # the example's "evaluation before training", over a DataLoader: step 0 closes in it
    with torch.no_grad():
        for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(512, 32)), batch_size=64):
            model(x)
for step in range(40):
    loss = loss_fn(torch.randn(64, 32))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 4:
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(2048, 32))  # EVAL
print("ok")
"""


@pytest.mark.parametrize("evaluate_first", [False, True])
def test_the_trained_model_inside_a_loss_with_a_guide_is_timed_when_called_alone(tmp_path, evaluate_first):
    body = f"EVALUATE_FIRST = {evaluate_first}\n" + GUIDED
    result, facts, findings = probed_job(tmp_path, body)
    assert result.stdout == "ok\n"
    assert facts["step_source"] == "optimizer"
    steps = [s for s in facts["steps"] if s["step"] >= 1]
    evaluating = sorted(s["step"] for s in steps if s.get("inference_ms", 0.0) > s.get("frozen_inference_ms", 0.0))
    assert evaluating == [5, 10, 15, 20, 25, 30, 35], evaluating
    line = next(i for i, t in enumerate(body.splitlines(), start=1) if "# EVAL" in t)
    assert facts["inference_site"] == f"{tmp_path / 'job.py'}:{line}"


def test_the_wrapped_model_is_chosen_among_the_parameters_that_train():
    import warnings

    import torch

    from torchdoctor.probe import hooks

    class Holder(torch.nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a, self.b = a, b

    def ids(*modules):
        return {id(p) for m in modules for p in m.parameters()}

    model, guide = torch.nn.Linear(64, 64), torch.nn.Linear(64, 48)  # 4,160 and 3,120 parameters
    loss = Holder(model, guide)
    model(torch.randn(2, 64)).sum().backward()
    # By what requires grad the model holds 57%: no wrapped model.
    assert hooks._wrapped_model(loss) is None
    # The guide sits in the optimizer that trains the model and never gets a gradient: left out.
    assert hooks._wrapped_model(loss, [ids(loss)]) is model
    # An actor-critic (or a GAN) with an optimizer each, the critic's gradients cleared: both halves count.
    assert hooks._wrapped_model(loss, [ids(model), ids(guide)]) is None
    # A module compiled in place (module.compile() sets _compiled_call_impl) runs its forward
    # compiled: no hooks under it. (Set by hand: torch.compile's import is not this test's.)
    loss._compiled_call_impl = loss._call_impl
    assert hooks._wrapped_model(loss, [ids(loss)]) is None
    # A non-leaf parameter (learn2learn's clones) is not asked for its .grad, which warns.
    clone = torch.nn.Linear(4, 4)
    clone._parameters["weight"] = clone.weight * 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hooks._wrapped_model(Holder(clone, torch.nn.Linear(4, 4)), [])
