"""ScienceWorld (Wang et al. 2022) as an env: `--env scienceworld:boil[,melt][?vars=10&snap=1&valid=0]`.

Each simulator is a Java process (~2-4 s to start, ~0.8 GB), so envs do not own one: they lease a
JVM from a bounded module-wide pool for each call and give it back. An env keeps its episode as the
list of commands sent since reset; when the JVM it gets is not in its state (another env used it
meanwhile) it replays them (ScienceWorld is deterministic per task and variation). So any number of
envs (trees) share `ORCHARD_SCIENCEWORLD_JVMS` JVMs (default 2) without deadlock, paying replays
only when they contend. There is no state save in ScienceWorld: restore is replay from reset.

- Tasks: ScienceWorld's task names (arg, comma separated; all 30 when empty) x its own
  train/dev/test variation lists, the first `vars` (default 10) of each; id "boil-3". Goals are the
  simulator's task descriptions, cached on disk (one load each, ~0.1 s, once).
- Steps use the simulator's lean calls (step, score, completion) instead of `ScienceWorldEnv.step`,
  which also builds look/inventory/valid-action lists every step (~5x slower).
- Score 0..100 -> progress (latched, negative = 0); at the end reward = score / 100 (1.0 = solved).
- `valid_commands()` is the simulator's valid action list; `valid=1` appends it to observations.
  With `snap=1` (default) a command the parser rejects is snapped to the closest valid action (as
  Agent-R does); ambiguous commands pick the simulator's first reading.
- `expert(task_id)` is the simulator's gold action sequence.
"""

from __future__ import annotations

import atexit
import difflib
import itertools
import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine.envs.base import EnvBase, EnvError, Step, TaskSpec
from engine.envs.registry import split_options
from engine.paths import cache_dir

SPLITS = ("train", "dev", "test")
OPTIONS = {"vars": str, "snap": bool, "valid": bool, "steps": int, "simplify": str}
NO_MATCH = "No known action matches that input."
AMBIGUOUS = "Ambiguous request"
LEASE_TIMEOUT_S = 300.0

DESCRIPTION = """ScienceWorld: an interactive science simulation (rooms, objects, substances, devices).
Commands (one per step): look around, look at OBJ, look in OBJ, go to LOC, open/close OBJ,
activate/deactivate OBJ, pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ into OBJ,
dunk OBJ into OBJ, mix OBJ, use OBJ [on OBJ], connect OBJ to OBJ, disconnect OBJ, read OBJ, eat OBJ,
flush OBJ, focus on OBJ (signals the task's object; focusing on the wrong one fails the task),
wait, wait1, inventory, task. Name objects as the observations do, e.g. "pick up thermometer"."""


@dataclass
class _Jvm:
    """One simulator process and which env state it currently holds."""

    sw: Any
    sync: tuple[int, int, str] | None = None  # (env token, commands sent, task key)
    busy: bool = False
    last_used: float = 0.0


class JvmPool:
    """At most `size` warm ScienceWorld JVMs, leased per call (threads wait for a free one)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise EnvError("the ScienceWorld JVM pool needs at least 1 process")
        self.size = size
        self.started = 0
        self._jvms: list[_Jvm] = []
        self._cond = threading.Condition()

    @contextmanager
    def lease(self, token: int):
        jvm = self._acquire(token)
        try:
            yield jvm
        except Exception:
            jvm.sync = None  # state unknown after a failure: the next user replays
            raise
        finally:
            with self._cond:
                jvm.busy, jvm.last_used = False, time.monotonic()
                self._cond.notify()

    def _acquire(self, token: int) -> _Jvm:
        deadline = time.monotonic() + LEASE_TIMEOUT_S
        with self._cond:
            while True:
                free = [j for j in self._jvms if not j.busy]
                if free:  # prefer the JVM already in this env's state, else the least recently used
                    jvm = next((j for j in free if j.sync and j.sync[0] == token), None)
                    jvm = jvm or min(free, key=lambda j: j.last_used)
                    jvm.busy = True
                    return jvm
                if len(self._jvms) < self.size:
                    jvm = _Jvm(sw=None, busy=True)
                    self._jvms.append(jvm)
                    break
                if not self._cond.wait(timeout=max(deadline - time.monotonic(), 0.0)):
                    raise EnvError(f"no ScienceWorld process free after {LEASE_TIMEOUT_S:.0f}s "
                                   f"(pool of {self.size}; raise ORCHARD_SCIENCEWORLD_JVMS)")
        try:  # start outside the lock: other threads may use the warm ones meanwhile
            jvm.sw = _start_jvm()
            self.started += 1
        except BaseException:
            with self._cond:
                self._jvms.remove(jvm)
                self._cond.notify()
            raise
        return jvm

    def forget(self, token: int) -> None:
        """No JVM holds env `token`'s state any more (the env was closed)."""
        with self._cond:
            for jvm in self._jvms:
                if jvm.sync is not None and jvm.sync[0] == token:
                    jvm.sync = None

    def close(self) -> None:
        with self._cond:
            jvms, self._jvms = self._jvms, []
        for jvm in jvms:
            if jvm.sw is not None:
                try:
                    jvm.sw.close()
                except Exception:  # noqa: BLE001, S110 - best effort at shutdown
                    pass


def _start_jvm() -> Any:
    try:
        from scienceworld import ScienceWorldEnv as _Simulator
    except ModuleNotFoundError as e:
        raise EnvError(f"ScienceWorld needs the 'scienceworld' package: pip install -e '.[envs]' ({e})") from e
    try:
        return _Simulator("", envStepLimit=10_000)  # we enforce our own step limit
    except Exception as e:
        raise EnvError(f"could not start ScienceWorld's Java process (Java 17 needed): {e}") from e


_POOL: JvmPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> JvmPool:
    """The process-wide JVM pool (size from ORCHARD_SCIENCEWORLD_JVMS, default 2)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            size = os.environ.get("ORCHARD_SCIENCEWORLD_JVMS", "2")
            if not size.isdigit():
                raise EnvError(f"ORCHARD_SCIENCEWORLD_JVMS must be a whole number, not {size!r}")
            _POOL = JvmPool(int(size))
            atexit.register(_POOL.close)
        return _POOL


# -- task catalogue (cached on disk) -------------------------------------------------------------


def _catalogue_path():
    import scienceworld

    return cache_dir("scienceworld") / f"catalogue-{scienceworld.__version__}.json"


_CATALOGUE: dict[str, Any] | None = None
_CAT_LOCK = threading.Lock()


def _catalogue(names: list[str] | None, vars_cap: int | None, simplify: str) -> dict[str, Any]:
    """Task names, variation splits and task descriptions, filling in what `names` need."""
    global _CATALOGUE
    with _CAT_LOCK:
        if _CATALOGUE is None:
            path = _catalogue_path()
            _CATALOGUE = json.loads(path.read_text()) if path.exists() else {"tasks": [], "splits": {}, "goals": {}}
        cat, changed = _CATALOGUE, False
        wanted = names
        if _incomplete(cat, wanted, vars_cap):
            with pool().lease(-1) as jvm:
                jvm.sync = None
                if not cat["tasks"]:
                    cat["tasks"], changed = list(jvm.sw.get_task_names()), True
                unknown = [n for n in (wanted or []) if n not in cat["tasks"]]
                if unknown:
                    raise EnvError(f"unknown ScienceWorld task {unknown[0]!r} (known: {', '.join(cat['tasks'])})")
                for name in wanted or cat["tasks"]:
                    if name not in cat["splits"]:
                        jvm.sw.load(name, 0, simplify)
                        cat["splits"][name] = {"train": list(jvm.sw.get_variations_train()),
                                               "dev": list(jvm.sw.get_variations_dev()),
                                               "test": list(jvm.sw.get_variations_test())}
                        changed = True
                for name in wanted or cat["tasks"]:
                    for split in SPLITS:
                        for var in cat["splits"][name][split][:vars_cap]:
                            key = f"{name}-{var}"
                            if key not in cat["goals"]:
                                jvm.sw.load(name, var, simplify)
                                cat["goals"][key] = jvm.sw.get_task_description()
                                changed = True
        if changed:
            path = _catalogue_path()
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cat))
            os.replace(tmp, path)
        return cat


def _incomplete(cat: dict[str, Any], names: list[str] | None, vars_cap: int | None) -> bool:
    if not cat["tasks"]:
        return True
    for name in names or cat["tasks"]:
        splits = cat["splits"].get(name)
        if splits is None:
            return True
        if any(f"{name}-{v}" not in cat["goals"] for s in SPLITS for v in splits[s][:vars_cap]):
            return True
    return False


_TOKENS = itertools.count(1)


class ScienceWorldEnv(EnvBase):
    """ScienceWorld tasks through a shared JVM pool; deterministic, restored by replay."""

    name = "scienceworld"

    def __init__(self, arg: str = "") -> None:
        main, opts = split_options(arg or "", OPTIONS, "scienceworld")
        self.names = [n.strip() for n in main.split(",") if n.strip()] or None
        cap = str(opts.get("vars", "10"))
        if cap != "all" and (not cap.isdigit() or int(cap) < 1):
            raise EnvError("scienceworld: option vars must be a positive number or 'all'")
        self.vars_cap = None if cap == "all" else int(cap)
        self.snap = bool(opts.get("snap", True))
        self.show_valid = bool(opts.get("valid", False))
        self.step_limit = int(opts.get("steps", 100))
        simplify = str(opts.get("simplify", "easy"))
        self.simplify = "" if simplify == "none" else simplify
        self._token = next(_TOKENS)
        self._task: TaskSpec | None = None
        self._sent: list[str] = []
        self._best = 0.0
        self._done = False
        self._specs: dict[str, list[TaskSpec]] | None = None

    # -- tasks --------------------------------------------------------------------------------------

    def _all_specs(self) -> dict[str, list[TaskSpec]]:
        if self._specs is None:
            cat = _catalogue(self.names, self.vars_cap, self.simplify)
            specs: dict[str, list[TaskSpec]] = {s: [] for s in SPLITS}
            for name in self.names or cat["tasks"]:
                for split in SPLITS:
                    for var in cat["splits"][name][split][: self.vars_cap]:
                        specs[split].append(TaskSpec(id=f"{name}-{var}", goal=cat["goals"][f"{name}-{var}"],
                                                     split=split, meta={"task": name, "variation": var}))
            self._specs = specs
        return self._specs

    def describe(self) -> str:
        return DESCRIPTION

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        if split not in SPLITS:
            raise EnvError(f"unknown ScienceWorld split {split!r} (known: {', '.join(SPLITS)})")
        return list(self._all_specs()[split])

    def task(self, task_id: str) -> TaskSpec:
        for specs in self._all_specs().values():
            for spec in specs:
                if spec.id == task_id:
                    return spec
        first = next((s for specs in self._all_specs().values() for s in specs), None)
        raise EnvError(f"unknown ScienceWorld task id {task_id!r} (ids are TASK-VARIATION, e.g. "
                       f"{first.id if first else 'boil-0'}, within the first {self.vars_cap or 'all'} "
                       "variations of each split)")

    # -- episode ------------------------------------------------------------------------------------

    def _sync(self, jvm: _Jvm) -> None:
        """Bring `jvm` to this env's state: load the task and replay the commands if needed."""
        assert self._task is not None
        key = self._task.id
        if jvm.sync == (self._token, len(self._sent), key):
            return
        jvm.sync = None
        jvm.sw.load(self._task.meta["task"], self._task.meta["variation"], self.simplify)
        for command in self._sent:
            jvm.sw.server.step(command)
        jvm.sync = (self._token, len(self._sent), key)

    def _send(self, jvm: _Jvm, command: str) -> str:
        observation = jvm.sw.server.step(command)
        self._sent.append(command)
        jvm.sync = (self._token, len(self._sent), self._task.id)  # type: ignore[union-attr]
        return observation

    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        self._task, self._sent, self._best, self._done = task, [], 0.0, False
        with pool().lease(self._token) as jvm:
            jvm.sync = None
            jvm.sw.load(task.meta["task"], task.meta["variation"], self.simplify)
            jvm.sync = (self._token, 0, task.id)
            observation = self._send(jvm, "look around")
            return self._with_valid(jvm, observation)

    def step(self, command: str) -> Step:
        if self._task is None:
            raise EnvError("step() before reset(): call reset(task_id) first")
        if self._done:
            return Step("The task is over.", 0.0, True, self._best, {"ok": False})
        command = " ".join(command.split())
        info: dict[str, Any] = {"ok": True}
        with pool().lease(self._token) as jvm:
            self._sync(jvm)
            observation = self._send(jvm, command)
            if observation.strip() == NO_MATCH and self.snap:
                match = difflib.get_close_matches(command.lower(), self._valid(jvm), n=1, cutoff=0.6)
                if match:
                    observation = f"(interpreted as '{match[0]}')\n" + self._send(jvm, match[0])
                    info["snapped"] = match[0]
            if observation.startswith(AMBIGUOUS):
                choice = next((ln.split(":", 1)[1].strip() for ln in observation.splitlines()
                               if ln.startswith("0:")), "")
                observation = f"(ambiguous; chose: {choice})\n" + self._send(jvm, "0")
                info["disambiguated"] = choice
            server = jvm.sw.server
            score = round(100 * server.getScore())
            moves = int(server.getNumMoves())
            self._done = bool(server.getCompleted()) or score < 0 or moves > self.step_limit
            if not self._done:
                observation = self._with_valid(jvm, observation)
        self._best = max(self._best, max(score, 0) / 100)
        info.update(score=score, moves=moves)
        info["ok"] = info["ok"] and observation.strip() != NO_MATCH
        reward = max(score, 0) / 100 if self._done else 0.0
        if self._done:
            observation += f"\nThe task is over (score {score}/100)."
        return Step(observation, reward, self._done, self._best, info)

    def _valid(self, jvm: _Jvm) -> list[str]:
        return list(jvm.sw.get_valid_action_object_combinations())

    def _with_valid(self, jvm: _Jvm, observation: str) -> str:
        if not self.show_valid:
            return observation
        return f"{observation}\nValid actions: {', '.join(self._valid(jvm))}"

    def valid_commands(self) -> list[str]:
        if self._task is None:
            raise EnvError("valid_commands() before reset(): call reset(task_id) first")
        with pool().lease(self._token) as jvm:
            self._sync(jvm)
            return self._valid(jvm)

    def close(self) -> None:
        """Give up this env's claim on the shared JVMs: a JVM still holding its state is marked free of
        it (the next user reloads), so the pool does not keep preferring a closed env. The JVMs stay
        warm for other envs and are stopped at exit."""
        if _POOL is not None:
            _POOL.forget(self._token)
        self._task, self._sent, self._done = None, [], False

    def expert(self, task_id: str) -> list[str]:
        """The simulator's gold action sequence for the task (from reset, after 'look around')."""
        task = self.task(task_id)
        with pool().lease(-1) as jvm:
            jvm.sync = None
            jvm.sw.load(task.meta["task"], task.meta["variation"], self.simplify, generateGoldPath=True)
            return list(jvm.sw.get_gold_action_sequence())
