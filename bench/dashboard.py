"""Dashboard cost for big trees: on the server (load, layout, chart rows, Arrow) and in a real browser.

Builds synthetic MCTS-shaped SearchTrees (random branching 1-4, realistic composite actions,
observations, critic ranks, log-probs and terminals, every expansion followed by a simulation that is
back-propagated by the engine), writes each to a temporary store through the Store API, and times
what the Tree explorer did on a first view before it had a level of detail: `Store.load_tree`,
`layout_tree`, the chart's rows of the whole tree (`dashboard.tree_chart.tree_rows`) and the Arrow
serialisation Streamlit performs; and what it does now: the skeleton ("skel": numbers only,
`Store.tree_skeleton`), then "lod": the part drawn (`dashboard.lod`), its layout, its nodes' labels
(`Store.load_nodes`), the rows and their Arrow bytes (`tree_chart.chart_data`: the chart's rows and its small
named datasets).

Browser figures (`--browser-sizes`): `streamlit run` on one store holding those trees, headless Debian
Chromium through Playwright: navigation -> the plot drawn -> a click on a marker answered (the
inspector shows that node), and the bytes that came over the websocket, for the page as it is and
with `?max_nodes=all` (the whole tree, the old drawing) as the baseline. "cold": the first view of
a tree on a fresh server (the tree is read from the store); "warm": a later view (cached). "floor":
the same page on a 50-node tree; "-floor" subtracts it (on a busy machine the floor dominates: read
the goals against "-floor" and the load average). "empty page": a second server's page with a title
only (Streamlit itself), "+plotly" / "+vega": that page with one 50-point plotly / Vega-Lite chart (the
chart library itself). `--compare-ref REF`: the same views, interleaved, on the dashboard of commit REF
(a temporary git worktree), e.g. the plotly drawing before the Vega-Lite one. Each view's time is split
into ws1 (navigation -> first websocket frame), script (-> the chart's frame: the server's rerun) and
render (-> the markers drawn in the browser).
Goals: 10k nodes interactive <= 1 s, 100k <= 3 s.

    .venv/bin/python bench/dashboard.py [--sizes 1000 10000 100000] [--repeat 3]
                                        [--browser-sizes 10000 100000] [--no-baseline] [--compare-ref REF]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
logging.getLogger("streamlit").setLevel(logging.ERROR)  # "no runtime" notes from st.cache_* imports

from streamlit import dataframe_util

from dashboard.data import read_nodes, read_shape, read_tree
from dashboard.figures import short_command
from dashboard.layout import layout_tree
from dashboard.lod import DEFAULT_BUDGET, choose_open
from dashboard.tree_chart import chart_data, tree_rows
from engine.actions import CompositeAction, render
from engine.envs.base import TaskSpec
from engine.store import Store
from engine.tree_nodes import SearchTree, Simulation

T = TypeVar("T")
ITEMS = ["oak planks", "stick", "crafting table", "iron ingot", "cobblestone", "furnace", "torch", "chest"]


def synthetic_tree(n_nodes: int, seed: int = 0, depth_limit: int = 40) -> SearchTree:
    """An MCTS-like tree of about `n_nodes` nodes (random branching, one simulation per expansion)."""
    rng = random.Random(seed)
    task = TaskSpec(id=f"synthetic-{n_nodes}", goal="craft 1 chest", context="recipes ...")
    tree = SearchTree.new(task, "Crafting commands: get, craft, inventory. Goal: craft 1 chest.")
    open_leaves = [0]
    while len(tree.nodes) < n_nodes and open_leaves:
        parent = tree.nodes[open_leaves.pop(rng.randrange(len(open_leaves)))]
        k = rng.randint(1, 4)
        children = []
        for rank in range(k):
            item = rng.choice(ITEMS)
            if rng.random() < 0.05:
                children.append(tree.add_child(
                    parent, observation="Format error: no ACTION section. The environment was not stepped.",
                    raw="I think I should craft something", format_error="no ACTION section",
                    terminal="format_error", reward=0.0, logprob=-rng.uniform(5, 40), critic_rank=k - 1,
                    Q_critic=0.0, critic_reason="(format error: not shown to the critic)", n_tokens=12,
                ))
                continue
            action = CompositeAction(
                thought=f"I have what I need for {item}; next I craft it.",
                command=f"craft {rng.randint(1, 4)} {item} using {rng.randint(1, 3)} {rng.choice(ITEMS)}",
                explanation=f"This should give me {item}.",
                status="CONTINUE" if rng.random() < 0.97 else "SUCCESS",
                plan="1. get logs\n2. craft planks\n3. craft chest" if parent.parent is None else None,
            )
            depth = parent.depth + 1
            roll = rng.random()
            terminal = ("success" if roll < 0.04 else "failure" if roll < 0.08 else
                        "stopped" if action.status != "CONTINUE" else
                        "depth_limit" if depth >= depth_limit else None)
            children.append(tree.add_child(
                parent, action=action, raw=render(action),
                observation=f"Crafted {item}. Inventory: [{item}] ({rng.randint(1, 64)})"
                if rng.random() < 0.7 else "Could not find enough items to craft.",
                reward=1.0 if terminal == "success" else 0.0, progress=round(rng.random(), 2),
                terminal=terminal, logprob=-rng.uniform(5, 40), critic_rank=rank,
                Q_critic=1 - rank / max(1, k - 1), critic_reason=f"Candidate {rank + 1} moves toward the goal.",
                n_tokens=rng.randint(40, 120), gen_ms=rng.uniform(5, 50), env_ms=rng.uniform(0.1, 2),
            ))
        open_leaves += [c.id for c in children if c.terminal is None]
        leaf = rng.choice(children)
        reward = 1.0 if leaf.terminal == "success" or rng.random() < 0.2 else 0.0
        path = [n.id for n in tree.path(leaf)]
        tree.backpropagate(path, reward)
        tree.simulations.append(Simulation(tuple(path), reward))
    return tree


def write_store(path: Path, tree: SearchTree, name: str = "bench") -> int:
    """The whole tree in one transaction, through the Store API; returns its tree id."""
    return write_run(path, tree, name)[1]


def write_run(path: Path, tree: SearchTree, name: str = "bench") -> tuple[str, int]:
    """Like `write_store`, as a finished run of its own; returns (run id, tree id)."""
    with Store(path) as store:
        run_id = store.create_run(name, "synthetic", "none", {"alpha": 0.5, "k": 4}, [tree.task])
        ((tree_id, _),) = store.tree_ids(run_id)
        store.save_simulation(tree_id, tree, tree.simulations[-1], first_new=0)
        store.set_run_status(run_id, "finished")
    return run_id, tree_id


def best_of(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out  # type: ignore[return-value]


ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]  # as tests/dashboard/test_browser.py
# The node markers drawn (how many), and the page position of the i-th (or the next one that is not a
# hidden subtree: selecting one draws its subtree, a second drawing, timed apart). For either chart, so
# that `--compare-ref` can time an older page: plotly (plotly.js internals of the plot div) or Vega-Lite
# (the Vega view, found through the React component that holds it: Streamlit exposes it nowhere else;
# its mark named "nodes_marks" is `dashboard.tree_chart`'s "nodes" layer). Tests reuse these.
VEGA_VIEW = """const orchardViewOf = (el) => {
  for (const node of el ? [el, ...el.querySelectorAll('div')] : []) {
    const key = Object.keys(node).find(k => k.startsWith('__reactFiber$'));
    for (let f = key && node[key]; f; f = f.return)
      for (let h = f.memoizedState; h && typeof h === 'object' && 'next' in h; h = h.next) {
        const v = h.memoizedState && h.memoizedState.current;
        if (v && typeof v.scenegraph === 'function' && typeof v.signal === 'function') return v;
      }
  }
  return null };
const orchardMark = (v, name) => { let m = null;
  const walk = (it) => { if (!it || m) return;
    if (it.marktype) { if (it.name === name) m = it; else it.items.forEach(walk); }
    else if (it.items) it.items.forEach(walk); };
  walk(v.scenegraph().root); return m ? m.items : null };
const orchardViewWith = (name) => {  // the Vega view on the page that draws the mark `name`
  for (const el of document.querySelectorAll('[data-testid="stVegaLiteChart"]')) {
    const v = orchardViewOf(el); if (v && orchardMark(v, name)) return v; }
  return null };
const orchardView = () => orchardViewWith('nodes_marks');  // the Tree explorer's tree, not the run overview
const orchardNodes = (v) => orchardMark(v, 'nodes_marks') || [];
const orchardAt = (v, it) => { const box = v.container().querySelector('canvas').getBoundingClientRect();
  const o = v.origin(); return {id: Number(it.datum.id), x: box.left + o[0] + it.x, y: box.top + o[1] + it.y} };"""
MARKERS = """() => { const gd = document.querySelector('.js-plotly-plot');
  if (gd) { const tr = gd._fullData && gd._fullData.find(t => t.name === 'nodes');
            return tr && tr.customdata ? tr.customdata.length : 0 }
  """ + VEGA_VIEW + """ const v = orchardView(); return v ? orchardNodes(v).length : 0 }"""
MARKER_AT = """(i) => { const gd = document.querySelector('.js-plotly-plot');
  if (gd) { const tr = gd._fullData.find(t => t.name === 'nodes'), sym = tr.marker.symbol;
    while (Array.isArray(sym) && sym[i] === 'hexagon' && i + 1 < sym.length) i++;  // not a hidden subtree
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    return {id: Number(tr.customdata[i]), x: box.left + xa._offset + xa.l2p(tr.x[i]),
            y: box.top + ya._offset + ya.l2p(tr.y[i])} }
  """ + VEGA_VIEW + """ const v = orchardView(), items = orchardNodes(v);
  while (items[i].datum.kind === 'hidden' && i + 1 < items.length) i++;
  return orchardAt(v, items[i]) }"""
MARKER_OF = """(id) => { """ + VEGA_VIEW + """ const v = orchardView();
  const it = v && orchardNodes(v).find(it => Number(it.datum.id) === id); return it ? orchardAt(v, it) : null }"""
# Scrolls every scrolling box around the tree chart (and the window) so that node `id`'s marker sits in
# view, then returns its page position as MARKER_OF does: a big tree's chart is wider and taller than its
# scrolling container, so a marker can be drawn yet out of sight (a click there lands on something else).
REVEAL_OF = """(id) => { """ + VEGA_VIEW + """ const v = orchardView();
  const it = v && orchardNodes(v).find(it => Number(it.datum.id) === id); if (!it) return null;
  for (let el = v.container().parentElement; el; el = el.parentElement) {
    const s = getComputedStyle(el);
    if (!/(auto|scroll)/.test(s.overflowX + s.overflowY)) continue;
    const p = orchardAt(v, it), r = el.getBoundingClientRect();
    el.scrollTop += p.y - (r.top + r.height / 2); el.scrollLeft += p.x - (r.left + r.width / 2); }
  const p = orchardAt(v, it); window.scrollBy(p.x - innerWidth / 2, p.y - innerHeight / 2);
  return orchardAt(v, it) }"""
# The Vega-Lite chart's domains (its zoom) as [x lo, x hi, y lo, y hi]; null before it is drawn.
DOMAINS = """() => { """ + VEGA_VIEW + """ const v = orchardView();
  return v ? [...v.scale('x').domain(), ...v.scale('y').domain()].map(Number) : null }"""


def start_server(db: Path, log: Path, script: Path | None = None, root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    """`streamlit run dashboard/app.py` of `root` (or `script`) on `db`, loopback only, once healthy."""
    script = script or root / "dashboard" / "app.py"
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=root, env={**os.environ, "ORCHARD_DB": str(db), "PYTHONPATH": str(root)}, stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode} (log: {log})")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError("streamlit did not become healthy")


def open_tree(context, url: str, timeout_ms: int = 120_000) -> dict[str, float]:
    """A new page in `context` (static files cached, as for anyone on their second visit): navigate to
    `url` (a Tree explorer view), wait for the markers, click one in the middle and wait for the
    inspector to show it. Times are from the navigation start; bytes: what the websocket brought until
    the plot was drawn, then for the click (selecting a hexagon draws its subtree: a new figure)."""
    from playwright.sync_api import expect

    page = context.new_page()
    ws_bytes = [0]
    frames: list[tuple[float, int]] = []  # (arrival, bytes) of each websocket frame

    def received(payload: str | bytes) -> None:
        ws_bytes[0] += len(payload)
        frames.append((time.perf_counter(), len(payload)))

    page.on("websocket", lambda ws: ws.on("framereceived", received))
    try:
        t0 = time.perf_counter()
        page.goto(url)
        page.wait_for_function(MARKERS, timeout=timeout_ms)
        drawn = time.perf_counter() - t0
        to_draw = ws_bytes[0]
        # Where the time went: navigation -> first websocket frame (page and JS boot, session start),
        # -> the biggest frame (the figure: the script rerun on the server until the chart), -> drawn.
        first = frames[0][0] - t0 if frames else float("nan")
        figure = max(frames, key=lambda f: f[1])[0] - t0 if frames else float("nan")
        n = page.evaluate(MARKERS)
        target = page.evaluate(MARKER_AT, n // 2 if n > 1 else 0)
        page.mouse.move(target["x"], target["y"])
        page.mouse.click(target["x"], target["y"])
        page.wait_for_url(lambda u: "node=0" not in u, timeout=timeout_ms)
        node = page.url.split("node=")[1].split("&")[0]
        expect(page.get_by_role("heading", name=f"Node {node}", exact=True)).to_be_visible(timeout=timeout_ms)
        clicked = time.perf_counter() - t0
        return {"drawn": drawn, "clicked": clicked, "markers": n, "ws_mb": to_draw / 1e6,
                "click_mb": (ws_bytes[0] - to_draw) / 1e6, "ws_first": first, "figure": figure}
    finally:
        page.close()


# Streamlit's floor: a page with a title only; with ?chart=plotly also one 50-point Scattergl chart (the
# cost of plotly.js itself, whatever the figure), with ?chart=vega one 50-point Vega-Lite chart (Vega).
EMPTY_PAGE = """import streamlit as st
st.title("Empty page")
if st.query_params.get("chart") == "plotly":
    import plotly.graph_objects as go
    st.plotly_chart(go.Figure([go.Scattergl(x=list(range(50)), y=list(range(50)), mode="markers", name="nodes",
                                            customdata=list(range(50)))]), key="p", on_select="rerun")
if st.query_params.get("chart") == "vega":
    import pandas as pd
    st.vega_lite_chart(pd.DataFrame({"id": range(50), "x": range(50), "y": range(50)}), {"layer": [{
        "name": "nodes", "mark": "point", "params": [{"name": "pick", "select": {"type": "point", "fields": ["id"]}}],
        "encoding": {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"}}}]},
        key="v", on_select="rerun")
"""


def open_empty(context, url: str, chart: str = "", timeout_ms: int = 120_000) -> float:
    """Navigation -> the empty page's title shown (or, with `chart` "plotly" / "vega", its markers drawn)."""
    from playwright.sync_api import expect

    page = context.new_page()
    try:
        t0 = time.perf_counter()
        page.goto(url + (f"/?chart={chart}" if chart else ""))
        expect(page.get_by_role("heading", name="Empty page")).to_be_visible(timeout=timeout_ms)
        if chart:
            page.wait_for_function(MARKERS, timeout=timeout_ms)
        return time.perf_counter() - t0
    finally:
        page.close()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def before_tree(ref: str, tmp: Path) -> Path:
    """A detached git worktree of `ref` (its dashboard, for the same-run comparison); removed by `stop_before`."""
    where = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), ref], check=True)
    return where


def stop_before(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)


def browser_figures(sizes: list[int], baseline: bool, tmp: Path, compare_ref: str | None = None) -> None:
    """Navigation -> interactive tree in headless Chromium, and bytes sent, per size and drawing; with
    `compare_ref`, the same views on that commit's dashboard, in the same run, interleaved."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        print(f"browser figures skipped: no {CHROMIUM} (apt-get install chromium)")
        return
    db = tmp / "browser.db"
    views: list[tuple[int, str, str]] = []  # (nodes, run id, task id); first a tiny tree: the page's floor
    for size in [50, *sizes]:
        tree = synthetic_tree(size, seed=1)
        run_id, _ = write_run(db, tree, name=f"bench-{size}")
        views.append((len(tree.nodes), run_id, tree.task.id))
    empty = tmp / "empty_page.py"
    empty.write_text(EMPTY_PAGE)
    procs = []
    before_root = before_tree(compare_ref, tmp) if compare_ref else None
    rows = []
    floors: dict[str, list[float]] = {"": [], "plotly": [], "vega": []}
    try:
        empty_proc, empty_url = start_server(db, tmp / "streamlit-empty.log", empty)
        procs.append(empty_proc)
        proc, url = start_server(db, tmp / "streamlit.log")
        procs.append(proc)
        servers = {"now": url}
        if before_root is not None:
            before_proc, servers["before"] = start_server(db, tmp / "streamlit-before.log", root=before_root)
            procs.append(before_proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                contexts = {}
                for name, base in servers.items():  # one browser context per server, its static files cached
                    contexts[name] = browser.new_context(viewport={"width": 1500, "height": 1400})
                    open_tree(contexts[name], f"{base}/tree?run={views[0][1]}&task={views[0][2]}")
                empty_context = browser.new_context(viewport={"width": 1500, "height": 1400})
                for chart in ("plotly", "vega"):
                    open_empty(empty_context, empty_url, chart=chart)  # its static files cached too
                for _ in range(3):
                    for chart, times in floors.items():
                        times.append(open_empty(empty_context, empty_url, chart=chart))
                for i, (n, run_id, task) in enumerate(views):
                    path = f"/tree?run={run_id}&task={task}"
                    if i == 0:
                        for name, base in servers.items():
                            rows.append((n, name, "floor", "warm", open_tree(contexts[name], base + path)))
                        continue
                    for state in ("cold", "warm"):
                        for name, base in servers.items():
                            rows.append((n, name, "lod", state, open_tree(contexts[name], base + path)))
                    if baseline:
                        rows.append((n, "now", "full", "warm", open_tree(contexts["now"], url + path + "&max_nodes=all")))
            finally:
                browser.close()
    finally:
        for proc_ in procs:
            stop(proc_)
        if before_root is not None:
            stop_before(before_root)
    print(f"\nbrowser (headless Chromium; lod = at most {DEFAULT_BUDGET} markers, full = ?max_nodes=all; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; floor = a 50-node tree: the page's own cost"
          + (f"; page: now = this tree, before = {compare_ref}" if compare_ref else "") + ")")
    print("  ws1: navigation -> first websocket frame (page, JS, session) · script: -> the chart's frame (the "
          "server's rerun) · render: -> markers drawn · drawn: navigation -> markers drawn · click: a click answered")
    print(f"{'nodes':>8} {'page':>6} {'drawing':>7} {'server':>6} {'markers':>8} {'ws1 s':>6} {'script':>6} "
          f"{'render':>6} {'drawn s':>8} {'click s':>8} {'-floor':>7} {'ws MB':>7} {'click MB':>8} {'goal s':>6}")
    for chart, label, what in (("", "page", "an empty page"), ("plotly", "+plotly", "+ one 50-point plotly chart"),
                               ("vega", "+vega", "+ one 50-point Vega-Lite chart")):
        print(f"{'empty':>8} {'':>6} {label:>7} {'warm':>6} {0 if not chart else 50:>8} {'':>6} {'':>6} {'':>6} "
              f"{min(floors[chart]):>8.2f} {'':>8} {'':>7} {'':>7} {'':>8} {'':>6}   (Streamlit's floor: {what}, best of 3)")
    floor = {page: r["clicked"] for _, page, mode, _, r in rows if mode == "floor"}
    for n, page, mode, state, r in rows:
        goal = "" if mode == "floor" else "1.0" if n <= 10_001 else "3.0"
        print(f"{n:>8} {page:>6} {mode:>7} {state:>6} {r['markers']:>8} {r['ws_first']:>6.2f} "
              f"{r['figure'] - r['ws_first']:>6.2f} {r['drawn'] - r['figure']:>6.2f} {r['drawn']:>8.2f} "
              f"{r['clicked']:>8.2f} {r['clicked'] - floor[page]:>+7.2f} {r['ws_mb']:>7.2f} {r['click_mb']:>8.2f} "
              f"{goal:>6}")
    for n, _, _ in views[1:]:
        new = next(r for m, page, mode, state, r in rows if (m, page, mode, state) == (n, "now", "lod", "warm"))
        goal = 1.0 if n <= 10_001 else 3.0
        line = (f"{n:>8} nodes: navigation -> interactive (click answered) {new['clicked']:.2f} s, drawn "
                f"{new['drawn']:.2f} s; goal {goal:g} s: {'met' if new['clicked'] <= goal else 'not met'}")
        old = next((r for m, page, mode, state, r in rows if (m, page, mode, state) == (n, "before", "lod", "warm")),
                   None)
        if old is not None:
            line += (f"; before ({compare_ref}) {old['clicked']:.2f} s, drawn {old['drawn']:.2f} s "
                     f"(x{old['clicked'] / new['clicked']:.1f})")
        full = next((r for m, page, mode, _, r in rows if (m, page, mode) == (n, "now", "full")), None)
        if full is not None:
            line += (f"; the whole tree drawn {full['clicked']:.2f} s, websocket {full['ws_mb']:.2f} MB vs "
                     f"{new['ws_mb']:.2f} MB")
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--browser-sizes", type=int, nargs="*", default=[10_000, 100_000],
                    help="tree sizes for the browser figures (none: skip them)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the whole-tree drawing in the browser")
    ap.add_argument("--compare-ref", metavar="REF", help="also time the dashboard of this git commit (a temporary "
                    "worktree) in the same run, e.g. the commit before a change")
    args = ap.parse_args()

    print(f"{'nodes':>8} {'load s':>8} {'layout s':>9} {'rows s':>9} {'total s':>8} {'arrow s':>7} "
          f"{'+arrow s':>8} {'arrow MB':>8} | {'skel s':>6} {'lod s':>6} {'+arrow s':>8} {'arrow MB':>8}")
    layout_per_node: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            tree = synthetic_tree(size)
            db = Path(tmp) / f"bench-{size}.db"
            tree_id = write_store(db, tree)
            t_load, loaded = best_of(lambda db=db, tid=tree_id: read_tree(str(db), tid), args.repeat)
            assert loaded is not None and len(loaded.nodes) == len(tree.nodes)
            t_layout, lay = best_of(lambda t=loaded: layout_tree(t), args.repeat)
            t_fig, fig = best_of(lambda t=loaded, lay=lay: tree_rows(t, lay, "q", 0.5, t.best_path(0.5)), args.repeat)
            t_json, spec = best_of(lambda fig=fig: dataframe_util.convert_anything_to_arrow_bytes(fig), args.repeat)
            total = t_load + t_layout + t_fig
            layout_per_node[len(loaded.nodes)] = t_layout / len(loaded.nodes)

            # What the page does now: read the skeleton (no texts), choose, lay out, read the drawn nodes'
            # labels, draw the part shown.
            t_skel, shape = best_of(lambda db=db, tid=tree_id: read_shape(str(db), tid), args.repeat)

            def drawn_part(shape=shape, db=db, tid=tree_id):
                part = layout_tree(shape, opened=choose_open(shape, DEFAULT_BUDGET))
                labels = {v: short_command(n) for v, n in read_nodes(str(db), tid, part.ids.tolist()).items()}
                rows = tree_rows(shape, part, "q", 0.5, shape.best_path(0.5), commands=labels)
                main, subsets = chart_data(rows)  # what the page sends: the rows and the small datasets
                return b"".join(dataframe_util.convert_anything_to_arrow_bytes(f) for f in [main, *subsets.values()])

            t_lod, lod_spec = best_of(drawn_part, args.repeat)
            print(f"{len(loaded.nodes):>8} {t_load:>8.3f} {t_layout:>9.3f} {t_fig:>9.3f} {total:>8.3f} "
                  f"{t_json:>7.3f} {total + t_json:>8.3f} {len(spec) / 1e6:>8.1f} | {t_skel:>6.3f} {t_lod:>6.3f} "
                  f"{t_skel + t_lod:>8.3f} {len(lod_spec) / 1e6:>8.2f}")
        sizes = sorted(layout_per_node)
        if len(sizes) >= 2:
            lo, hi = sizes[0], sizes[-1]
            ratio = layout_per_node[hi] * hi / (layout_per_node[lo] * lo)
            print(f"layout {lo} -> {hi} nodes ({hi / lo:.0f}x): time x{ratio:.1f}, "
                  f"per node {layout_per_node[lo] * 1e6:.2f} -> {layout_per_node[hi] * 1e6:.2f} us "
                  f"(linear keeps per-node time flat; quadratic would be x{(hi / lo) ** 2:.0f})")
        if args.browser_sizes:
            browser_figures(args.browser_sizes, not args.no_baseline, Path(tmp), args.compare_ref)


if __name__ == "__main__":
    main()
