"""Reading one OpenAI-compatible completion reply: the generic read (`safejson.loads` + `parse_choices`, a
dict per token) vs the typed read (`openai_reply.decode_choices`), microseconds per reply and their ratio.

Replies as bench/delayed_server.py writes them (n completions of a token count each; each token's log-prob
entry `minimal` or as vLLM writes it), the two reads alternating, the best of `--repeat` timings of
`--number` reads each. The typed read must give the same completions (checked first).

    .venv/bin/python bench/reply_read.py [--tokens 95] [--n 1,4] [--repeat 5] [--number 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from delayed_server import logprob_entries

from engine import safejson
from engine.llm.openai_reply import decode_choices, parse_choices

TEXT = "THOUGHT: next step.\nACTION: craft 4 oak planks using 1 oak log\nEXPLANATION: progress.\nSTATUS: CONTINUE"


def reply(n: int, tokens: int, entries: str) -> bytes:
    return json.dumps({"object": "chat.completion", "model": "m", "choices": [
        {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": TEXT},
         "logprobs": {"content": logprob_entries(tokens, entries)}} for i in range(n)],
        "usage": {"completion_tokens": n * tokens}}).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=95, help="tokens per completion (the delayed server's mean)")
    ap.add_argument("--n", default="1,4", help="completions per reply")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'entries':>8} {'n':>2} {'bytes':>7} | {'generic':>9} {'typed':>9} {'ratio':>6}")
    for entries in ("minimal", "vllm"):
        for n in (int(x) for x in args.n.split(",")):
            raw = reply(n, args.tokens, entries)

            def generic(raw: bytes = raw) -> list:
                return parse_choices(safejson.loads(raw), "chat", ())

            def typed(raw: bytes = raw) -> list | None:
                return decode_choices(raw, "chat", ())

            if typed() != generic():
                raise SystemExit("the typed read gives other completions than the generic one")
            best = {"generic": float("inf"), "typed": float("inf")}
            for _ in range(args.repeat):  # alternate, so that a busy moment weighs on both
                for name, fn in (("generic", generic), ("typed", typed)):
                    best[name] = min(best[name], timeit.timeit(fn, number=args.number) / args.number)
            print(f"{entries:>8} {n:>2} {len(raw):>7} | {1e6 * best['generic']:>7.1f}us {1e6 * best['typed']:>7.1f}us "
                  f"{best['generic'] / best['typed']:>5.1f}x", flush=True)


if __name__ == "__main__":
    main()
