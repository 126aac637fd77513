"""The host-time profile times each phase of the engine's steps around the engine's own
functions, and leaves the engine as it found it."""

from course_server import model_and_tokenizer
from inferlab.benchmarks.host_time import measure
from inferlab.serving import paged_attention as runner_module
from inferlab.serving.scheduler import Scheduler


def test_every_phase_is_timed_once_a_step_and_the_engine_is_restored():
    model, _ = model_and_tokenizer()
    before = (Scheduler.schedule, Scheduler.update, runner_module.prepare, runner_module.sample)
    r = measure(model, batch=2, prompt=16, tokens=4)
    assert (Scheduler.schedule, Scheduler.update, runner_module.prepare,
            runner_module.sample) == before
    assert "forward" not in vars(model)
    assert r["steps"] == 4  # one prefill step, then three decodes (the fourth token ends it)
    assert all(r[p] > 0 for p in ("forward", "schedule", "metadata", "sample", "update"))
    assert abs(r["host"] - sum(r[p] for p in ("schedule", "metadata", "sample", "update"))) < 1e-12
