"""Scale-out: the no-barrier scheduler, model-spec concurrency, multi-server routing (real local
HTTP servers: bench/delayed_server.py, per-request-seeded answers)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from delayed import delayed_server
from doubles import ScriptedGenerator, SnapshotLineEnv

from engine.config import SearchConfig
from engine.llm.base import GeneratorError, SupportsDriven, SupportsSubmit
from engine.llm.openai_http import OpenAIGenerator
from engine.llm.registry import load_generator
from engine.search.mcts import MCTS, start_tree


def _jobs(cfg, n_tasks=6):
    env = SnapshotLineEnv()
    return [start_tree(t, SnapshotLineEnv, cfg.simulations) for t in env.tasks()[:n_tasks]]


def _texts(tree):
    """Everything a tree holds except timings: structure, statistics, texts."""
    return [(n.parent, n.raw, n.action.command if n.action else None, n.N, round(n.value_sum, 9), n.Q_critic,
             n.critic_rank, n.critic_reason, n.terminal, n.observation) for n in tree.nodes]


class _Queued:
    """The same client without `driven`: its answers land on its loop thread and queue to the search's."""

    def __init__(self, gen) -> None:
        self.gen, self.name = gen, gen.name

    def sample(self, requests):
        return self.gen.sample(requests)

    def submit(self, request, affinity=None):
        return self.gen.submit(request, affinity)

    def logprobs(self, prompts, completions):
        return self.gen.logprobs(prompts, completions)


def test_no_barrier_gives_the_same_trees_as_the_round_barrier():
    cfg = SearchConfig(simulations=4, k=3, depth_limit=4, seed=3)
    with delayed_server(time_scale=0.05) as (url, _):
        gen = OpenAIGenerator(url, "m", max_concurrency=16)
        assert isinstance(gen, SupportsSubmit) and isinstance(gen, SupportsDriven)
        free_jobs = _jobs(cfg)
        free = MCTS(gen, cfg).run(free_jobs)  # driven: the search's thread runs the client's I/O
        assert gen._loop_http is not None and gen._loop_http._thread is None  # no loop thread was started
        queued_jobs = _jobs(cfg)
        queued = MCTS(_Queued(gen), cfg).run(queued_jobs)
        assert gen._loop_http._thread is not None
        barrier_jobs, barrier = _jobs(cfg), None
        barrier = MCTS(gen, cfg, rounds=True).run(barrier_jobs)
        gen.close()
    assert barrier.simulations == free.simulations == queued.simulations == 6 * 4
    assert free.requests == queued.requests == barrier.requests
    assert free.completions == queued.completions == barrier.completions
    for a, b, c in zip(barrier_jobs, free_jobs, queued_jobs, strict=True):
        assert a.tree.check_invariants() == b.tree.check_invariants() == c.tree.check_invariants() == []
        assert _texts(a.tree) == _texts(b.tree) == _texts(c.tree)
        assert [s.path for s in a.tree.simulations] == [s.path for s in b.tree.simulations] == \
            [s.path for s in c.tree.simulations]


class _SlowTreeGenerator(ScriptedGenerator):
    """ScriptedGenerator with `submit`: requests of task goal-1 answer after `slow_s`, others at once."""

    def __init__(self, slow_s: float) -> None:
        super().__init__()
        self.slow_s = slow_s

    def submit(self, request, affinity=None) -> Future:
        fut: Future = Future()
        result = self.sample([request])[0]
        if affinity == "goal-1":
            threading.Timer(self.slow_s, fut.set_result, (result,)).start()
        else:
            fut.set_result(result)
        return fut


def test_a_slow_tree_holds_no_other_tree():
    cfg = SearchConfig(simulations=3, k=2, depth_limit=3)
    order: list[str] = []
    gen = _SlowTreeGenerator(0.05)
    MCTS(gen, cfg, on_simulation=lambda job, sim: order.append(job.tree.task.id)).run(_jobs(cfg, 4))
    # every fast tree finished all its simulations before the slow one finished its first
    assert order[: 3 * 3] == [t for t in order if t != "goal-1"] and order.count("goal-1") == 3
    # the same generator behind the round barrier: the slow tree holds every round
    order.clear()
    MCTS(gen, cfg, rounds=True, on_simulation=lambda job, sim: order.append(job.tree.task.id)).run(_jobs(cfg, 4))
    assert order.index("goal-1") < 4


class _FailingTreeGenerator(ScriptedGenerator):
    """ScriptedGenerator with `submit` whose futures for task goal-2 fail: from a timer thread, as an
    HTTP backend's do, or (`at_once`) before `submit` returns."""

    def __init__(self, at_once: bool) -> None:
        super().__init__()
        self.at_once = at_once

    def submit(self, request, affinity=None) -> Future:
        fut: Future = Future()
        if affinity != "goal-2":
            fut.set_result(self.sample([request])[0])
        elif self.at_once:
            fut.set_exception(GeneratorError("server goal-2 refused"))
        else:
            threading.Timer(0.01, fut.set_exception, (GeneratorError("server goal-2 refused"),)).start()
        return fut


@pytest.mark.parametrize("at_once", [False, True])
def test_a_failed_request_ends_the_no_barrier_run_with_its_error(at_once):
    """The future's error reaches the scheduler through its done callback and is raised there, as
    `sample`'s error is behind the round barrier; every started tree's env is closed."""
    cfg = SearchConfig(simulations=3, k=2, depth_limit=3)
    jobs = _jobs(cfg, 4)
    with pytest.raises(GeneratorError, match="server goal-2 refused"):
        MCTS(_FailingTreeGenerator(at_once), cfg).run(jobs)
    assert all(job.session is None for job in jobs)
    assert not next(j for j in jobs if j.tree.task.id == "goal-2").tree.simulations


def test_rounds_false_needs_submit():
    with pytest.raises(GeneratorError, match="no submit"):
        MCTS(ScriptedGenerator(), SearchConfig(), rounds=False)


def test_concurrency_is_a_spec_setting_with_a_default_fitted_to_the_server_kind():
    assert OpenAIGenerator("http://127.0.0.1:1/v1", "m").max_concurrency == 64  # self-hosted (vLLM)
    assert OpenAIGenerator("https://api.example.com/v1", "m").max_concurrency == 8  # hosted API
    gen = load_generator("openai:http://127.0.0.1:1/v1#m?concurrency=5&retries=0")
    assert (gen.max_concurrency, gen.retries) == (5, 0)
    assert gen.name == "openai:http://127.0.0.1:1/v1#m?concurrency=5&retries=0"
    assert load_generator(gen.name).max_concurrency == 5  # the name loads it again (resume)
    with pytest.raises(GeneratorError, match=r"unknown option 'conc=5' after '\?'"):
        load_generator("openai:http://127.0.0.1:1/v1#m?conc=5")
    with pytest.raises(GeneratorError, match="concurrency='x' is not a number"):
        load_generator("openai:http://127.0.0.1:1/v1#m?concurrency=x")


def test_submit_keeps_the_concurrency_limit():
    with delayed_server(time_scale=0.2) as (url, _):
        gen = OpenAIGenerator(url, "m", max_concurrency=4)
        from engine.llm.base import SampleRequest, SamplingParams

        t = time.perf_counter()
        futs = [gen.submit(SampleRequest([{"role": "user", "content": "hi"}], 1, SamplingParams(seed=i)))
                for i in range(8)]
        assert all(len(f.result()) == 1 for f in futs)
        wall = time.perf_counter() - t
        gen.close()
    # 8 requests of >= 15 ms each (0.2 x 75 ms) through 4 slots take at least two waves
    assert wall >= 2 * 0.2 * 0.075


def _stats(url: str) -> dict:
    import httpx

    return httpx.get(url.removesuffix("/v1") + "/stats", timeout=5).json()


def test_two_servers_affinity_held_a_killed_server_trees_moved_no_request_lost():
    from engine.llm.routing import RoutedGenerator

    cfg = SearchConfig(simulations=6, k=3, depth_limit=4, seed=5)
    with delayed_server(time_scale=0.1) as (ref_url, _):  # the reference: one server
        ref = OpenAIGenerator(ref_url, "m")
        ref_jobs = _jobs(cfg, 8)
        MCTS(ref, cfg).run(ref_jobs)
        ref.close()
    with delayed_server(time_scale=0.1) as (url_a, proc_a), delayed_server(time_scale=0.1) as (url_b, _):
        gen = load_generator(f"openai:{url_a},{url_b}#m?retries=0")
        assert isinstance(gen, RoutedGenerator) and gen.name == f"openai:{url_a},{url_b}#m?retries=0"
        before: dict = {}

        def on_simulation(job, sim):
            if len(before) == 0 and sum(len(j.tree.simulations) for j in jobs) >= 12:
                before.update({k: list(v) for k, v in gen.routes.items()})
                before["served_a"] = _stats(url_a)["requests"]
                proc_a.kill()  # mid-run: requests in flight on A fail, A's trees move to B

        jobs = _jobs(cfg, 8)
        stats = MCTS(gen, cfg, on_simulation=on_simulation).run(jobs)
        assert isinstance(gen, SupportsDriven)  # both servers' clients on one loop, driven by this thread
        assert all(s._loop_http is not None and s._loop_http._thread is None for s in gen.servers)
        gen.close()
    served_a = before.pop("served_a")
    assert served_a > 0 and stats.simulations == 8 * 6
    # affinity held before the kill (one server per tree), load balanced (4 trees each)
    assert all(len(r) == 1 for r in before.values())
    assert sorted(sum(1 for r in before.values() if r[0] == i) for i in (0, 1)) == [4, 4]
    # after: every tree that was on A ended on B, B's trees never moved
    for key, route in gen.routes.items():
        assert route[-1] == 1 and (route == [1] or route[0] == 0), (key, route)
    assert gen.outages == 1 and gen.moves == 4
    # nothing lost or duplicated: the same trees as with one server
    for a, b in zip(ref_jobs, jobs, strict=True):
        assert b.tree.check_invariants() == [] and len(b.tree.simulations) == 6
        assert _texts(a.tree) == _texts(b.tree)


def test_a_bad_request_is_not_moved_between_servers():
    from engine.llm.openai_http import HTTPStatusError, ServerUnavailable, is_outage

    assert is_outage(ServerUnavailable("x")) and is_outage(HTTPStatusError("x", 503))
    assert not is_outage(HTTPStatusError("x", 400)) and not is_outage(GeneratorError("x"))
