"""Client CPU per request of OpenAIGenerator with 64 / 256 requests in flight (issue 30).

Starts bench/delayed_server.py as its own process (so this process's CPU time is the client's
alone), keeps N requests in flight through the real `OpenAIGenerator.submit` (limit N: N pool
threads, as N trees in flight with `concurrency=N`; each answer submits the next request), and
prints, over a window after a warm-up, the process CPU time per answered request (and the kernel's
share of it), requests/s and the mean requests in flight (Little's law: summed latency / window).
Arms, alternating within the same run:
- before: httpx's connection pool shared by all threads (`openai_http.shared_pool_client`),
  safejson's bracket-by-bracket depth scan of every reply and the json module (the code before
  issue 30);
- threads: each pool thread's own keep-alive socket read by `http.client`
  (`engine.llm.thread_transport`, the default from 2026-12-03 to 2026-12-05), the whole-document
  depth check and the json module;
- loop-json: one event-loop thread for every request in flight (`engine.llm.loop_http`), the json
  module parsing and encoding (the default of 2026-12-05 morning);
- after: the generator's default for an http:// server: the event loop, and orjson under safejson.
Then the ratios before / after, threads / after and loop-json / after. First, the parse of one
vLLM-shaped reply (80 tokens, each log-prob with its token, bytes and top_logprobs): the bare
`json.loads`, `safejson.loads` (size, depth and text checks, then the parser) on the json module and
on orjson; and the encoding of a request body (`json.dumps` as httpx sends it, `safejson.dumps`).
The server answers after time_scale x (50 ms + 2.5 ms per token, 10-180 tokens): 30-200 ms at the
default 0.4.

    .venv/bin/python bench/driver_cpu.py [--trees 64,256] [--seconds 7] [--repeats 2] [--time-scale 0.4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from scale import start_server

from engine import safejson
from engine.llm.base import SampleRequest, SamplingParams
from engine.llm.openai_http import OpenAIGenerator, shared_pool_client

ARMS = ("before", "threads", "loop-json", "after")


def drive(url: str, trees: int, arm: str, warmup: float, seconds: float) -> dict[str, float]:
    """N requests kept in flight for warmup + seconds; the figures of the last `seconds`."""
    gen = OpenAIGenerator(url, "m", max_concurrency=trees)
    assert gen._loop_http is not None, "the default client for an http:// server is the event loop"
    if arm in ("before", "threads"):  # the pool threads, each with its own connection (`threads`) or one shared pool
        gen._loop_http = None
    if arm == "before":
        gen._client.close()
        gen._client = shared_pool_client(gen.timeout_s, trees)
    # "before": every reply's depth checked bracket by bracket (safejson.check_depth), as before
    safejson_fast, orjson = safejson._within_depth, safejson.orjson
    if arm == "before":
        safejson._within_depth = lambda text, max_depth: False
    if arm != "after":
        safejson.orjson = None  # the json module parses and encodes
    lock = threading.Lock()
    st = {"next": 0, "done": 0, "latency": 0.0, "errors": 0, "in_flight": 0}
    measuring = threading.Event()
    stopping = threading.Event()
    drained = threading.Event()

    def one() -> None:
        with lock:
            i = int(st["next"])
            st["next"] += 1
            st["in_flight"] += 1
        req = SampleRequest([{"role": "user", "content": f"task {i % 1000}: craft a stick"}], 1,
                            SamplingParams(max_tokens=64, seed=i))
        began = time.perf_counter()
        gen.submit(req).add_done_callback(lambda f: landed(f, began))

    def landed(fut, began: float) -> None:
        took = time.perf_counter() - began
        with lock:
            st["in_flight"] -= 1
            if fut.exception() is not None:
                st["errors"] += 1
            elif measuring.is_set():
                st["done"] += 1
                st["latency"] += took
            if stopping.is_set() and st["in_flight"] == 0:
                drained.set()
        if not stopping.is_set():
            one()

    for _ in range(trees):
        one()
    time.sleep(warmup)
    with lock:
        measuring.set()
        cpu, wall, sys_s = time.process_time(), time.perf_counter(), os.times().system
    time.sleep(seconds)
    with lock:
        measuring.clear()
        cpu, wall, sys_s = time.process_time() - cpu, time.perf_counter() - wall, os.times().system - sys_s
        done, latency, errors = st["done"], st["latency"], st["errors"]
        stopping.set()
    drained.wait(30)
    gen.close()
    safejson._within_depth, safejson.orjson = safejson_fast, orjson
    if errors:
        print(f"  warning: {errors} requests failed ({arm}, {trees} trees)", flush=True)
    return {"cpu_ms": 1e3 * cpu / max(done, 1), "rps": done / wall, "in_flight": latency / wall,
            "latency_ms": 1e3 * latency / max(done, 1), "cores": cpu / wall,
            "sys_ms": 1e3 * sys_s / max(done, 1)}


def vllm_reply(tokens: int = 80) -> bytes:
    """A chat completion as vLLM returns it with `logprobs: true` (token, log-prob, bytes, top_logprobs)."""
    content = [{"token": "tok", "logprob": -0.01, "bytes": [116, 111, 107], "top_logprobs": []}] * tokens
    message = {"role": "assistant", "content": "THOUGHT: next step.\nACTION: get 1 iron ingot\nSTATUS: CONTINUE"}
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": message, "logprobs": {"content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 300, "completion_tokens": tokens}}).encode()


def _best(fn, arg, repeats: int) -> float:
    runs = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(repeats):
            fn(arg)
        runs.append((time.process_time() - t) / repeats)
    return min(runs)


def parse_costs(repeats: int = 2000) -> None:
    reply = vllm_reply()
    body = {"model": "m", "n": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 200, "seed": 7, "logprobs": True,
            "messages": [{"role": "system", "content": "You are a crafting agent. " * 60},
                         {"role": "user", "content": "Goal: craft a stick.\nObservation: you have 1 oak log.\n" * 20}]}
    orjson = safejson.orjson
    bare = _best(json.loads, reply, repeats)
    safejson.orjson = None
    on_json, enc_json = _best(safejson.loads, reply, repeats), _best(safejson.dumps, body, repeats)
    safejson.orjson = orjson
    on_orjson, enc_orjson = _best(safejson.loads, reply, repeats), _best(safejson.dumps, body, repeats)
    print(f"parse of a vLLM-shaped reply ({len(reply)} bytes, 80 log-probs), best of 5 x {repeats}: json.loads "
          f"{1e6 * bare:.0f} us; safejson.loads on the json module {1e6 * on_json:.0f} us, on orjson "
          f"{1e6 * on_orjson:.0f} us ({on_json / on_orjson:.1f}x)", flush=True)
    print(f"encode of a request body ({len(safejson.dumps(body))} bytes): json.dumps {1e6 * enc_json:.1f} us, "
          f"safejson.dumps on orjson {1e6 * enc_orjson:.1f} us ({enc_json / enc_orjson:.0f}x)"
          + ("" if orjson else " -- orjson is not installed here"), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="64,256", help="requests in flight (= trees in flight, = the limit)")
    ap.add_argument("--seconds", type=float, default=7.0, help="measured window per run")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before the window (connections open)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per arm, alternating; medians reported")
    ap.add_argument("--time-scale", type=float, default=0.4, help="scale every server delay")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)}")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        raise SystemExit(f"unknown arm(s) {sorted(unknown)}: known {', '.join(ARMS)}")
    parse_costs()
    proc, url = start_server(args.time_scale)
    print(f"server delays x{args.time_scale}; window {args.seconds:.0f} s after {args.warmup:.0f} s warm-up; "
          f"{args.repeats} runs per arm, medians; client CPU = this process's CPU time / requests answered")
    print(f"{'trees':>5} {'arm':>15} {'CPU/request':>11} {'kernel':>8} {'req/s':>6} {'in flight':>9} "
          f"{'latency':>8} {'cores':>5}")
    try:
        for trees in (int(t) for t in args.trees.split(",")):
            runs: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    runs[arm].append(drive(url, trees, arm, args.warmup, args.seconds))
            med = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
            for arm, m in med.items():
                each = "/".join(f"{r['cpu_ms']:.2f}" for r in runs[arm])
                print(f"{trees:>5} {arm:>15} {m['cpu_ms']:>8.2f} ms {m['sys_ms']:>5.2f} ms "
                      f"{m['rps']:>6.0f} {m['in_flight']:>9.0f} {m['latency_ms']:>5.0f} ms {m['cores']:>5.2f}  "
                      f"(runs {each} ms)", flush=True)
            for base in ("before", "threads", "loop-json"):
                if base in med and "after" in med:
                    ratio = med[base]["cpu_ms"] / med["after"]["cpu_ms"]
                    print(f"{trees:>5} {base + ' / after':>15} {ratio:>8.1f} x  (client CPU per request)",
                          flush=True)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
