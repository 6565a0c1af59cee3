"""Refinement tuning data (AgentRefine, arXiv 2501.01702; docs/algorithms.md §5): persona -> script ->
trajectory -> verifier -> chat rows.

WHY this shape:
- Each stage is one model call whose output is checked by pure functions (`check_script`,
  `verify_trajectory`), so the rules are testable without a model. A script's validation rules are
  REGEXES, never code: we never execute what a model wrote. Patterns must compile with Python `re`
  (the documented dialect) and are matched with the `regex` module (a hard dependency of
  transformers), whose `timeout` bounds catastrophic backtracking; commands and patterns are also
  length-capped.
- The model plays the Dungeon Master and the player in ONE call that returns a JSON list of turns.
  On the first violated rule we keep the verified prefix and ask for a continuation; a complete
  trajectory with too few error-then-correction episodes is regenerated from scratch with the
  previous attempt shown (as the paper does). Everything is bounded per persona: the paper keeps
  what passes within 4 model calls, script calls included (`RefineConfig.max_calls`).
- All personas advance together: each round sends every unfinished job's next prompt in ONE
  `Generator.sample` call (scripts, continuations and regenerations mixed), so vLLM or an HTTP
  server sees large batches, never one prompt at a time.
- Output is the shared SFT `Sample` (kind "refine"; `to_row` renders a JSONL row of chat messages
  with per-message `train` flags, docs/algorithms.md §6): DM observations are user turns, the player's thought +
  action are assistant turns, and turns the DM flagged as erroneous get loss False (training on them
  cost ~75% of SciWorld score in the paper's ablation).

Cost counters: the Generator protocol reports completion tokens (`Completion.n_tokens`) but not
prompt tokens, so prompts are counted in characters (`prompt_chars`), never estimated.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import regex

from engine import safejson
from engine.config import ConfigError
from engine.datasets.samples import Sample, Task, Turn, stable_id, to_messages
from engine.llm.base import Completion, ContextOverflow, Generator, Prompt, SampleRequest, SamplingParams
from engine.safejson import JSONLimitError

ERRORS = ("none", "parameter", "logic", "location")
DEFAULT_PERSONAS = Path(__file__).resolve().parents[2] / "data" / "personas.jsonl"
# Strings no sensible action should accept: a pattern that accepts them validates nothing.
_PROBES = ("", "zzqx qqzx 9")
_ROLE_ALIASES = {"dm": "dm", "dungeon master": "dm", "dungeon_master": "dm", "player": "player"}


@dataclass(frozen=True)
class RefineConfig:
    """AgentRefine settings. `max_calls` (4, script calls included) is the paper's budget; the
    other values are ours (docs/algorithms.md: unpublished values are config options)."""

    min_corrections: int = 2  # error-then-correction episodes a kept trajectory needs
    max_calls: int = 4  # model calls per persona, all stages together
    script_attempts: int = 2  # script generations per persona (first try + retries with feedback)
    max_continuations: int = 2  # "continue from the verified prefix" calls per persona
    max_regenerations: int = 1  # "too few corrections: write a new trajectory" calls per persona
    min_actions: int = 4  # player actions asked for in the prompt (not enforced: the rules decide)
    max_actions: int = 12
    temperature: float = 0.8
    top_p: float = 1.0
    script_max_tokens: int = 1536
    trajectory_max_tokens: int = 4096
    max_pattern_chars: int = 200
    max_command_chars: int = 200
    regex_timeout_s: float = 0.05
    max_answer_chars: int = 262_144  # longer model answers are rejected unparsed (~16x trajectory_max_tokens)
    jobs_in_flight: int = 256  # personas advanced together; their prompts share one batch
    seed: int = field(default=0, metadata={"help": "persona sampling and request seeds"})

    def __post_init__(self) -> None:
        checks = {
            "min_corrections": self.min_corrections >= 0,
            "max_calls": self.max_calls >= 2,
            "script_attempts": self.script_attempts >= 1,
            "max_continuations": self.max_continuations >= 0,
            "max_regenerations": self.max_regenerations >= 0,
            "min_actions": self.min_actions >= 1,
            "max_actions": self.max_actions >= self.min_actions,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "script_max_tokens": self.script_max_tokens >= 1,
            "trajectory_max_tokens": self.trajectory_max_tokens >= 1,
            "max_pattern_chars": self.max_pattern_chars >= 1,
            "max_command_chars": self.max_command_chars >= 1,
            "regex_timeout_s": self.regex_timeout_s > 0,
            "max_answer_chars": self.max_answer_chars >= 1,
            "jobs_in_flight": self.jobs_in_flight >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"RefineConfig.{name}: invalid value {getattr(self, name)!r}")


# ---------------------------------------------------------------- personas


@dataclass(frozen=True)
class Persona:
    id: str
    persona: str


def load_personas(path: str | Path = DEFAULT_PERSONAS) -> list[Persona]:
    """Personas from a JSONL file of {"id", "persona"}; problems are ConfigErrors naming the line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read personas ({e.strerror})") from None
    out: list[Persona] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{n}: not JSON ({e.msg})") from None
        if not (isinstance(item, dict) and isinstance(item.get("id"), str) and isinstance(item.get("persona"), str)
                and item["id"] and item["persona"].strip()):
            raise ConfigError(f'{p}:{n}: expected {{"id": str, "persona": str}}')
        if item["id"] in seen:
            raise ConfigError(f"{p}:{n}: duplicate persona id {item['id']!r}")
        seen.add(item["id"])
        out.append(Persona(item["id"], item["persona"].strip()))
    if not out:
        raise ConfigError(f"{p}: no personas")
    return out


def sample_personas(personas: Sequence[Persona], n: int, seed: int = 0) -> list[Persona]:
    """`n` personas: a seeded sample without replacement, cycling through reshuffles past the end
    (each job gets its own sampling seed, so repeated personas still give different scripts)."""
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    out: list[Persona] = []
    while len(out) < n:
        out += rng.sample(list(personas), min(len(personas), n - len(out)))
    return out


# ---------------------------------------------------------------- scripts


@dataclass(frozen=True)
class Violation:
    """The first broken rule: `rule` is a stable name (counted in stats), `turn` a turn index
    (scripts: the action index), `detail` is shown to the model in the retry prompt."""

    rule: str
    turn: int
    detail: str


@dataclass(frozen=True)
class Action:
    name: str
    pattern: str
    parameters: dict[str, tuple[str, ...]]
    examples: tuple[str, ...]
    compiled: Any = field(compare=False, repr=False)


@dataclass(frozen=True)
class Script:
    environment: dict[str, Any]
    task: str
    actions: tuple[Action, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "task": self.task,
            "actions": [
                {"name": a.name, "pattern": a.pattern, "parameters": {k: list(v) for k, v in a.parameters.items()},
                 "examples": list(a.examples)}
                for a in self.actions
            ],
        }


def _norm(text: str) -> str:
    return " ".join(text.split())


def _command_problem(actions: Sequence[Action], command: str, config: RefineConfig) -> tuple[str, str] | None:
    """None when `command` fully matches some action with valid parameter values (both compared
    case-insensitively), else (kind, why): kind is "too_long", "parameter" (matched a pattern, but
    with a value outside its list) or "no_match". A match that times out counts as no match."""
    cmd = _norm(command)
    if len(cmd) > config.max_command_chars:
        return "too_long", f"the action is longer than {config.max_command_chars} characters"
    reasons = []
    for a in actions:
        try:
            m = a.compiled.fullmatch(cmd, timeout=config.regex_timeout_s)
        except TimeoutError:
            m = None
        if m is None:
            continue
        bad = [
            f"{k}={v!r} is not one of {list(a.parameters[k])}"
            for k, v in m.groupdict().items()
            if v is not None and _norm(v).casefold() not in {x.casefold() for x in a.parameters[k]}
        ]
        if not bad:
            return None
        reasons.append(f"it matches action {a.name!r} but {'; '.join(bad)}")
    if reasons:
        return "parameter", "; ".join(reasons)
    return "no_match", f"{cmd!r} matches none of the actions {[a.name for a in actions]}"


def check_script(data: object, config: RefineConfig | None = None) -> Script | Violation:
    """The script self-check: returns the Script, or the first violation. Rules: schema, unique
    action names, pattern length / `re` syntax, named groups == parameters (each with valid values),
    every example matches its own pattern with valid values, no pattern accepts the probes."""
    config = config or RefineConfig()
    if not isinstance(data, dict):
        return Violation("script_schema", 0, "the script must be a JSON object")
    env, task, actions = data.get("environment"), data.get("task"), data.get("actions")
    if not isinstance(env, dict) or not env:
        return Violation("script_schema", 0, '"environment" must be a non-empty object')
    if not isinstance(task, str) or not task.strip():
        return Violation("script_schema", 0, '"task" must be a non-empty string')
    if not isinstance(actions, list) or not actions:
        return Violation("script_schema", 0, '"actions" must be a non-empty list')
    built: list[Action] = []
    names: set[str] = set()
    for i, a in enumerate(actions):
        where = f"action {i}"
        if not isinstance(a, dict):
            return Violation("script_schema", i, f"{where} must be an object")
        name, pattern, params, examples = a.get("name"), a.get("pattern"), a.get("parameters", {}), a.get("examples")
        if not isinstance(name, str) or not name.strip():
            return Violation("script_schema", i, f'{where}: "name" must be a non-empty string')
        where = f"action {name!r}"
        if name.strip().casefold() in names:
            return Violation("duplicate_action", i, f"{where} is defined twice")
        names.add(name.strip().casefold())
        if not isinstance(pattern, str) or not pattern.strip():
            return Violation("script_schema", i, f'{where}: "pattern" must be a non-empty string')
        if not isinstance(params, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, str) and x.strip() for x in v) for v in params.values()
        ):
            return Violation("script_schema", i, f'{where}: "parameters" must map names to non-empty lists of strings')
        if not isinstance(examples, list) or not examples or not all(isinstance(x, str) for x in examples):
            return Violation("script_schema", i, f'{where}: "examples" must be a non-empty list of strings')
        if len(pattern) > config.max_pattern_chars:
            return Violation("pattern_too_long", i, f"{where}: pattern longer than {config.max_pattern_chars} characters")
        try:
            re.compile(pattern)
            compiled = regex.compile(pattern, regex.IGNORECASE | regex.VERSION0)
        except (re.error, regex.error, OverflowError, RecursionError) as e:  # e.g. a{99999999999}
            return Violation("pattern_invalid", i, f"{where}: pattern {pattern!r} does not compile: {e}")
        if set(compiled.groupindex) != set(params):
            return Violation(
                "parameters_mismatch", i,
                f"{where}: named groups {sorted(compiled.groupindex)} differ from parameters {sorted(params)}",
            )
        action = Action(name.strip(), pattern, {k: tuple(_norm(x) for x in v) for k, v in params.items()},
                        tuple(examples), compiled)
        for ex in examples:
            problem = _command_problem([action], ex, config)
            if problem is not None:
                rule = "example_parameter" if problem[0] == "parameter" else "example_mismatch"
                return Violation(rule, i, f"{where}: example {ex!r} fails its own rule: {problem[1]}")
        for probe in _PROBES:
            if _command_problem([action], probe, config) is None:
                return Violation("pattern_too_broad", i, f"{where}: pattern {pattern!r} accepts {probe!r}")
        built.append(action)
    return Script(env, task.strip(), tuple(built))


# ---------------------------------------------------------------- tolerant JSON extraction


def extract_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (code fences and prose around it are fine). Raises
    JSONLimitError when a candidate object is past the bounded parser's limits (engine.safejson):
    the answer is rejected then, not searched further (each later `{` would be inside it)."""
    for m in re.finditer(r"\{", text):
        try:
            value, _ = safejson.raw_decode(text, m.start())
        except JSONLimitError:
            raise
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_turns(text: str) -> tuple[list[Any], str | None]:
    """The turns of a JSON list in `text`, read item by item so that a list cut off (e.g. at
    max_tokens) or broken mid-way still yields its complete leading turns. Returns (turns, error):
    error is None when the list is complete, else says where the JSON broke (after `turns`)."""
    m = re.search(r"\[\s*[{\]]", text)
    if m is None:
        return [], "the answer contains no JSON list of turns"
    items: list[Any] = []
    i = m.start() + 1
    while True:
        i = _skip_space(text, i)
        if i >= len(text):
            return items, f"the JSON list is cut off after {len(items)} turns"
        if text[i] == "]":
            return items, None
        if items:
            if text[i] != ",":
                return items, f"invalid JSON after turn {len(items) - 1}: expected ',' or ']'"
            i = _skip_space(text, i + 1)
        try:
            value, i = safejson.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if e.pos >= len(text.rstrip()):  # ran out of text: the answer hit its token limit
                return items, f"the JSON list is cut off after {len(items)} turns"
            return items, f"invalid JSON in turn {len(items)}: {e.msg}"
        items.append(value)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def parse_script(text: str, config: RefineConfig | None = None) -> Script | Violation:
    config = config or RefineConfig()
    if len(text) > config.max_answer_chars:
        return Violation("script_json", 0, f"the answer is longer than {config.max_answer_chars} characters")
    try:
        data = extract_object(text)
    except JSONLimitError as e:
        return Violation("script_json", 0, f"the JSON object is not acceptable: {e.msg}")
    if data is None:
        return Violation("script_json", 0, "the answer contains no JSON object")
    return check_script(data, config)


# ---------------------------------------------------------------- trajectory verifier


@dataclass(frozen=True)
class Verification:
    """`turns`: the verified prefix (normalized turns; a player turn counts only together with the
    DM turn that evaluates it, so a non-empty prefix ends with a DM turn). `violation`: the first
    broken rule, None when the trajectory is kept. `corrections`: error-then-correction episodes in
    the prefix. `flagged`: indices of player turns the DM evaluated as erroneous. `dropped`: turns
    after the DM declared the task complete (ignored)."""

    turns: tuple[dict[str, Any], ...]
    violation: Violation | None
    complete: bool
    corrections: int
    flagged: tuple[int, ...]
    dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.violation is None


def _normalize_turn(turn: object, index: int) -> dict[str, Any] | Violation:
    """A turn in canonical form, or a `structure` / `alternation` violation. DM turns come at even
    indices, player turns at odd ones (the DM opens with the first observation)."""

    def bad(detail: str) -> Violation:
        return Violation("structure", index, f"turn {index}: {detail}")

    if not isinstance(turn, dict):
        return bad("must be a JSON object")
    role = _ROLE_ALIASES.get(str(turn.get("role", "")).strip().lower())
    if role is None:
        return bad(f'"role" must be "dm" or "player", not {turn.get("role")!r}')
    expected = "dm" if index % 2 == 0 else "player"
    if role != expected:
        return Violation("alternation", index, f"turn {index} must be a {expected} turn (DM first, then "
                                               f"player and DM alternate), not a {role} turn")
    thought = turn.get("thought", "")
    if not isinstance(thought, str):
        return bad('"thought" must be a string')
    if role == "player":
        action = turn.get("action")
        if not isinstance(action, str) or not action.strip():
            return bad('a player turn needs a non-empty "action" string')
        return {"role": "player", "thought": thought.strip(), "action": _norm(action)}
    observation = turn.get("observation")
    if not isinstance(observation, str) or not observation.strip():
        return bad('a DM turn needs a non-empty "observation" string')
    complete = turn.get("task_complete", False)
    if not isinstance(complete, bool):
        return bad('"task_complete" must be true or false')
    evaluation = turn.get("evaluation")
    if index == 0 and evaluation is None:  # nothing to judge before the first action
        evaluation = {"error": "none", "detail": ""}
    if not isinstance(evaluation, dict):
        return bad('a DM turn needs an "evaluation" object')
    error = str(evaluation.get("error", "")).strip().lower()
    if error not in ERRORS:
        return bad(f'evaluation "error" must be one of {list(ERRORS)}, not {evaluation.get("error")!r}')
    detail = evaluation.get("detail", "")
    return {
        "role": "dm",
        "thought": thought.strip(),
        "observation": observation.strip(),
        "evaluation": {"error": "none" if index == 0 else error, "detail": str(detail).strip()},
        "task_complete": complete,
    }


def verify_trajectory(
    turns: Sequence[object],
    script: Script,
    config: RefineConfig | None = None,
    parse_error: str | None = None,
) -> Verification:
    """Check `turns` in order against docs/algorithms.md §5's rules; stop at the first violation.

    Rules (violation names): `structure` (a turn lacks its fields), `alternation` (roles out of
    order), `action` (a player action matches no script action with valid parameters and the DM's
    next evaluation did not flag an error), `json` (`parse_error`: the JSON list broke after
    `turns`), `task_complete` (the last turn is not a DM turn completing the task), `corrections`
    (complete, but fewer than `min_corrections` error-then-correction episodes)."""
    config = config or RefineConfig()
    norm: list[dict[str, Any]] = []
    verified = 0
    violation: Violation | None = None
    complete = False
    for i, raw in enumerate(turns):
        turn = _normalize_turn(raw, i)
        if isinstance(turn, Violation):
            violation = turn
            break
        norm.append(turn)
        if turn["role"] == "player":
            continue  # judged with the DM turn that evaluates it
        if i > 0 and turn["evaluation"]["error"] == "none":
            problem = _command_problem(script.actions, norm[i - 1]["action"], config)
            if problem is not None:
                violation = Violation("action", i - 1, f"turn {i - 1}: the action is not valid and the DM did "
                                                       f"not flag it: {problem[1]}")
                break
        verified = i + 1
        if turn["task_complete"]:
            complete = True
            break
    else:
        end = len(turns)
        if parse_error is not None:
            violation = Violation("json", end, parse_error)
        else:
            violation = Violation("task_complete", max(end - 1, 0), "the trajectory ends without a DM turn "
                                                                   'that says "task_complete": true')
    prefix = norm[:verified]
    flagged = tuple(i - 1 for i in range(2, len(prefix), 2) if prefix[i]["evaluation"]["error"] != "none")
    corrections = sum(1 for p in flagged if p + 2 < len(prefix) and p + 2 not in flagged)
    if complete and corrections < config.min_corrections:
        violation = Violation(
            "corrections", len(prefix),
            f"the task is complete but the trajectory has {corrections} error-then-correction episode(s) "
            f"(an action the DM flags, fixed by the next action); at least {config.min_corrections} are needed",
        )
    dropped = len(turns) - verified if complete else 0
    return Verification(tuple(prefix), violation, complete, corrections, flagged, dropped)


# ---------------------------------------------------------------- prompts

EXAMPLE_SCRIPT: dict[str, Any] = {
    "environment": {
        "locations": ["counter", "pantry", "kitchen"],
        "objects": {"flour": "a bag of flour on a pantry shelf", "oven": "a hot oven in the kitchen"},
        "player": {"location": "counter", "inventory": []},
    },
    "task": "Bake a loaf of bread in the oven and put it on the counter.",
    "actions": [
        {"name": "go", "pattern": r"go to (?P<place>[a-z ]+)",
         "parameters": {"place": ["counter", "pantry", "kitchen"]}, "examples": ["go to pantry"]},
        {"name": "take", "pattern": r"take (?P<item>[a-z ]+)",
         "parameters": {"item": ["flour", "bread"]}, "examples": ["take flour"]},
        {"name": "bake", "pattern": r"bake (?P<item>[a-z ]+) in (?P<appliance>[a-z ]+)",
         "parameters": {"item": ["flour"], "appliance": ["oven"]}, "examples": ["bake flour in oven"]},
        {"name": "put", "pattern": r"put (?P<item>[a-z ]+) on (?P<place>[a-z ]+)",
         "parameters": {"item": ["bread"], "place": ["counter"]}, "examples": ["put bread on counter"]},
    ],
}


def _dm(thought: str, observation: str, error: str = "none", detail: str = "", done: bool = False) -> dict:
    return {"role": "dm", "thought": thought, "observation": observation,
            "evaluation": {"error": error, "detail": detail}, "task_complete": done}


def _pl(thought: str, action: str) -> dict:
    return {"role": "player", "thought": thought, "action": action}


EXAMPLE_TRAJECTORY: list[dict[str, Any]] = [
    _dm("The player starts at the counter with nothing.", "You stand at the counter. Doors lead to the pantry "
        "and the kitchen."),
    _pl("Bread needs flour, which is probably in the pantry.", "go to pantry"),
    _dm("The player moved to the pantry.", "You are in the pantry. A bag of flour sits on a shelf."),
    _pl("I will grab the flour.", "grab flour"),
    _dm("'grab' is not an available action, so nothing happens.", "Nothing happens.", "parameter",
        "'grab' is not an action; the action is 'take'."),
    _pl("'grab' did not work; the available action is 'take'.", "take flour"),
    _dm("The player now carries the flour.", "You take the bag of flour."),
    _pl("Now I can bake it.", "bake flour in oven"),
    _dm("The oven is in the kitchen and the player is still in the pantry.", "There is no oven here.",
        "location", "The player must be in the kitchen to use the oven."),
    _pl("The oven is in the kitchen, so I must go there first.", "go to kitchen"),
    _dm("The player is in the kitchen with the flour.", "You are in the kitchen. The oven is hot."),
    _pl("Now I am next to the oven.", "bake flour in oven"),
    _dm("The flour becomes bread, now in the player's hands.", "A golden loaf of bread comes out of the oven."),
    _pl("The bread must go on the counter.", "go to counter"),
    _dm("The player is back at the counter.", "You are at the counter."),
    _pl("I put the bread down to finish.", "put bread on counter"),
    _dm("The bread is on the counter: the task is done.", "You place the bread on the counter.", done=True),
]

_SCRIPT_PROMPT = """You are writing a script for a text game that will train AI agents, like a tabletop \
role-playing game scenario.

Persona: {persona}

Write a game world inspired by this persona. The script has three parts:
1. "environment": the world: "locations", "objects" (name -> where it is and what it is), and "player" (where \
the player starts and what they carry).
2. "task": one clear, specific goal the player can finish in {min_actions} to {max_actions} actions.
3. "actions": the commands the player may type. Each action has
   - "name": a short unique name;
   - "pattern": a Python regular expression that a whole command must match (case is ignored), with a named \
group (?P<name>...) for each parameter; keep it short (at most {max_pattern} characters) and simple, with no \
nested repetition such as (a+)+;
   - "parameters": for each named group, the list of its valid values, taken from the environment;
   - "examples": one to three commands that match the pattern and use valid values.

Answer with ONLY a JSON object shaped like this example (your world will be different):
{example}"""

_TRAJECTORY_PROMPT = """You will write the complete log of one game played with the script below. You play \
BOTH roles: the Dungeon Master (DM), who runs the world, and the player, who tries to finish the task.

Script:
{script}

The log is a JSON list of turns. It starts with a DM turn; then player and DM turns alternate; it ends with \
a DM turn.
- A DM turn: {{"role": "dm", "thought": ..., "observation": ..., "evaluation": {{"error": ..., "detail": ...}}, \
"task_complete": false}}
  "thought": the player's state, what is known so far, and what the player's last action leads to.
  "observation": what the player sees now (the first DM turn describes the start).
  "evaluation" judges the player's PREVIOUS action: "error" is "none", "parameter" (the action is not one of \
the script's actions or uses an invalid parameter), "logic" (allowed, but impossible or pointless now) or \
"location" (the player is not where that action can be done); "detail" explains.
  "task_complete": true only in the last turn, once the task is done.
- A player turn: {{"role": "player", "thought": ..., "action": ...}}. "thought" reasons about the situation; \
"action" is ONE command, which should match an action's pattern with valid parameters.
- The player makes {min_actions} to {max_actions} actions, among them at least {min_corrections} mistakes that \
the DM flags in its evaluation; each mistake is fixed by the player's very next action.

Answer with ONLY the JSON list, like this example for another script (yours will be different):
{example}"""

_RETRY_SCRIPT = """The script failed a check ({rule}): {detail}
Write the corrected script. Answer with ONLY the JSON object."""

_CONTINUE = """The log was checked: turns 0 to {last} are fine, but {detail}
Continue the log after turn {last}: answer with ONLY a JSON list of the turns that follow, starting with a \
player turn and ending with the DM turn that completes the task."""

_RESTART = """The log was rejected: {detail}
Write a new log from the beginning. Answer with ONLY the JSON list."""


def script_prompt(persona: Persona, config: RefineConfig | None = None) -> Prompt:
    config = config or RefineConfig()
    text = _SCRIPT_PROMPT.format(
        persona=persona.persona, min_actions=config.min_actions, max_actions=config.max_actions,
        max_pattern=config.max_pattern_chars, example=json.dumps(EXAMPLE_SCRIPT, indent=1),
    )
    return [{"role": "user", "content": text}]


def trajectory_prompt(script: Script, config: RefineConfig | None = None) -> Prompt:
    config = config or RefineConfig()
    text = _TRAJECTORY_PROMPT.format(
        script=json.dumps(script.to_json(), indent=1, ensure_ascii=False), min_actions=config.min_actions,
        max_actions=config.max_actions, min_corrections=config.min_corrections,
        example=json.dumps(EXAMPLE_TRAJECTORY, indent=1),
    )
    return [{"role": "user", "content": text}]


def _dump_turns(turns: Sequence[object]) -> str:
    return json.dumps(list(turns), indent=1, ensure_ascii=False)


def continuation_prompt(script: Script, prefix: Sequence[dict[str, Any]], violation: Violation,
                        config: RefineConfig | None = None) -> Prompt:
    """The original request, the verified prefix as the model's own answer, then what broke."""
    base = trajectory_prompt(script, config)
    if not prefix:  # nothing survived: start over, told why
        return base + [{"role": "assistant", "content": "[]"},
                       {"role": "user", "content": _RESTART.format(detail=violation.detail)}]
    follow = _CONTINUE.format(last=len(prefix) - 1, detail=violation.detail)
    return base + [{"role": "assistant", "content": _dump_turns(prefix)}, {"role": "user", "content": follow}]


def regeneration_prompt(script: Script, previous: Sequence[object], violation: Violation,
                        config: RefineConfig | None = None) -> Prompt:
    """The paper's regeneration: all turns of the rejected attempt are shown, then a fresh start."""
    return trajectory_prompt(script, config) + [
        {"role": "assistant", "content": _dump_turns(previous)},
        {"role": "user", "content": _RESTART.format(detail=violation.detail)},
    ]


def _retry_script_prompt(persona: Persona, previous: str, violation: Violation, config: RefineConfig) -> Prompt:
    return script_prompt(persona, config) + [
        {"role": "assistant", "content": previous},
        {"role": "user", "content": _RETRY_SCRIPT.format(rule=violation.rule, detail=violation.detail)},
    ]


# ---------------------------------------------------------------- chat rows

_SYSTEM = """You are an agent in a text-based environment. Reach the task's goal, one action per turn.

Environment:
{environment}

Task: {task}

Available actions (examples):
{actions}

Answer every turn as:
Thought: <your reasoning>
Action: <one action>"""


def system_prompt(script: Script) -> str:
    actions = "\n".join(f"- {a.name}: {' | '.join(a.examples)}" for a in script.actions)
    environment = json.dumps(script.environment, indent=1, ensure_ascii=False)
    return _SYSTEM.format(environment=environment, task=script.task, actions=actions)


def to_sample(persona: Persona, script: Script, verification: Verification, source: dict[str, Any]) -> Sample:
    """The shared SFT sample (engine.datasets.samples): the system prompt carries environment, task
    and actions; the first DM observation is the first user message verbatim (`goal` stays empty);
    each player turn is an assistant turn "Thought: ...\nAction: ..." followed by the next DM
    observation, with loss False when that DM evaluation flagged it. The final observation (after
    the last action) is left out so the chat ends on the assistant; `source` keeps it."""
    turns = verification.turns
    out = []
    for i in range(1, len(turns), 2):
        player, dm = turns[i], turns[i + 1]
        last = i + 2 >= len(turns)
        out.append(Turn(
            text=f"Thought: {player['thought']}\nAction: {player['action']}",
            observation=None if last else dm["observation"],
            loss=dm["evaluation"]["error"] == "none",
        ))
    task = Task(id=persona.id, first_observation=turns[0]["observation"], system=system_prompt(script))
    content = [(t.text, t.observation, t.loss) for t in out]  # the chat, not who asked for it
    return Sample(id=stable_id("refine", task.system, task.first_observation, content), kind="refine",
                  task=task, turns=tuple(out), source=source)


def to_row(sample: Sample) -> dict[str, Any]:
    """A JSONL row: chat messages with per-message `train` flags (docs/algorithms.md §6) plus the provenance."""
    return {"id": sample.id, "kind": sample.kind, "messages": to_messages(sample), "meta": sample.source}


# ---------------------------------------------------------------- the pipeline

@dataclass
class RefineStats:
    """What a run cost and what it rejected. `calls` counts prompts sent (one completion each),
    `batches` the `Generator.sample` calls they were grouped into."""

    personas: int = 0
    rows: int = 0
    failed: int = 0
    batches: int = 0
    calls: int = 0
    calls_by_stage: Counter[str] = field(default_factory=Counter)
    completion_tokens: int = 0
    prompt_chars: int = 0
    completion_chars: int = 0
    scripts_kept: int = 0
    script_retries: int = 0
    continuations: int = 0
    regenerations: int = 0
    script_rejections: Counter[str] = field(default_factory=Counter)
    trajectory_rejections: Counter[str] = field(default_factory=Counter)
    failures_by_stage: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        # not asdict(): it rebuilds a Counter from (key, value) pairs, counting the pairs
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Counter) else value


@dataclass
class RefineResult:
    samples: list[Sample]
    failures: list[dict[str, Any]]  # {"persona", "stage", "reason", "script", "history", "cost"} per dropped one
    stats: RefineStats


@dataclass
class _Job:
    """One persona's progress through the stages."""

    index: int
    persona: Persona
    script: Script | None
    prompt: Prompt
    stage: str
    calls: int = 0
    completion_tokens: int = 0
    prompt_chars: int = 0
    script_attempts: int = 0
    continuations: int = 0
    regenerations: int = 0
    prefix: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def cost(self) -> dict[str, int]:
        return {"calls": self.calls, "completion_tokens": self.completion_tokens, "prompt_chars": self.prompt_chars}


def _seed(base: int, index: int, call: int) -> int:
    digest = hashlib.sha1(f"{base}:{index}:{call}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _strip_overlap(prefix: Sequence[dict[str, Any]], cont: list[Any]) -> list[Any]:
    """Drop the continuation's leading turns that repeat the prefix's last ones (models often
    restate the last DM turn, or restart the whole log): the longest such overlap."""
    def key(t: object) -> object:
        if not isinstance(t, dict):
            return None
        return (str(t.get("role", "")).strip().lower(), _norm(str(t.get("observation") or t.get("action") or "")))

    keys = [key(t) for t in prefix]
    for k in range(min(len(prefix), len(cont)), 0, -1):
        if [key(t) for t in cont[:k]] == keys[-k:]:
            return cont[k:]
    return cont


class _Pipeline:
    def __init__(self, generator: Generator, config: RefineConfig, stats: RefineStats,
                 on_sample: Callable[[Sample], None] | None,
                 on_batch: Callable[[RefineStats], None] | None = None) -> None:
        self.generator, self.config, self.stats, self.on_sample = generator, config, stats, on_sample
        self.on_batch = on_batch
        self.samples: list[Sample] = []
        self.failures: list[dict[str, Any]] = []

    def run(self, jobs: list[_Job]) -> None:
        queue = list(reversed(jobs))
        active: list[_Job] = []
        while queue or active:
            while queue and len(active) < self.config.jobs_in_flight:
                active.append(queue.pop())
            requests = [self._request(job) for job in active]
            overflowed: dict[int, str] = {}
            try:
                outputs: list[list[Completion] | None] = list(self.generator.sample(requests))
            except ContextOverflow as exc:  # those personas fail; the others' answers are kept
                outputs, overflowed = exc.partial, exc.overflowed
            self.stats.batches += 1
            for i, (job, req, out) in enumerate(zip(active, requests, outputs, strict=True)):
                if i in overflowed:
                    self._overflow(job, req, overflowed[i])
                    continue
                self._receive(job, req, out[0] if out else Completion(text="", finish_reason="error"))
            active = [job for job in active if not job.done]
            if self.on_batch is not None:
                self.on_batch(self.stats)

    def _request(self, job: _Job) -> SampleRequest:
        c = self.config
        max_tokens = c.script_max_tokens if job.stage == "script" else c.trajectory_max_tokens
        params = SamplingParams(temperature=c.temperature, top_p=c.top_p, max_tokens=max_tokens,
                                seed=_seed(c.seed, job.index, job.calls))
        return SampleRequest(job.prompt, n=1, params=params)

    def _count(self, job: _Job, req: SampleRequest, completion: Completion) -> None:
        s = self.stats
        chars = sum(len(m["content"]) for m in req.prompt)
        job.calls += 1
        job.completion_tokens += completion.n_tokens
        job.prompt_chars += chars
        s.calls += 1
        s.calls_by_stage[job.stage] += 1
        s.completion_tokens += completion.n_tokens
        s.prompt_chars += chars
        s.completion_chars += len(completion.text)

    def _overflow(self, job: _Job, req: SampleRequest, message: str) -> None:
        """The prompt (its script, prefix or retry grown past the model's context) was refused: the
        call counts, and the persona fails under the rule "context" (the run goes on)."""
        self._count(job, req, Completion(text="", finish_reason="error"))
        stage = "script" if job.stage == "script" else "trajectory"
        violation = Violation("context", -1, message)
        self._reject(job, stage, violation)
        self._fail(job, stage, f"context: {message}")

    def _receive(self, job: _Job, req: SampleRequest, completion: Completion) -> None:
        """Count the call's cost, then move the job on by what the model answered."""
        self._count(job, req, completion)
        if job.stage == "script":
            self._after_script(job, completion.text)
        else:
            self._after_trajectory(job, completion.text)

    def _reject(self, job: _Job, stage: str, v: Violation) -> None:
        counter = self.stats.script_rejections if stage == "script" else self.stats.trajectory_rejections
        counter[v.rule] += 1
        job.history.append({"stage": job.stage, "rule": v.rule, "turn": v.turn, "detail": v.detail})

    def _fail(self, job: _Job, stage: str, reason: str) -> None:
        job.done = True
        self.stats.failed += 1
        self.stats.failures_by_stage[stage] += 1
        script = job.script.to_json() if job.script is not None else None  # reusable via generate(scripts=)
        self.failures.append({"persona": asdict(job.persona), "stage": stage, "reason": reason, "script": script,
                              "history": job.history, "cost": job.cost()})

    def _budget_left(self, job: _Job) -> bool:
        return job.calls < self.config.max_calls

    def _after_script(self, job: _Job, text: str) -> None:
        job.script_attempts += 1
        result = parse_script(text, self.config)
        if isinstance(result, Script):
            self.stats.scripts_kept += 1
            job.script, job.stage = result, "trajectory"
            job.prompt = trajectory_prompt(result, self.config)
            if not self._budget_left(job):
                self._fail(job, "trajectory", f"no model calls left (max_calls={self.config.max_calls})")
            return
        self._reject(job, "script", result)
        if job.script_attempts < self.config.script_attempts and self._budget_left(job):
            self.stats.script_retries += 1
            job.prompt = _retry_script_prompt(job.persona, text, result, self.config)
        else:
            self._fail(job, "script", f"{result.rule}: {result.detail}")

    def _after_trajectory(self, job: _Job, text: str) -> None:
        assert job.script is not None
        turns: list[Any]
        parse_error: str | None
        if len(text) > self.config.max_answer_chars:
            turns, parse_error = [], f"the answer is longer than {self.config.max_answer_chars} characters"
        else:
            turns, parse_error = parse_turns(text)
        if job.stage == "continuation":
            turns = list(job.prefix) + _strip_overlap(job.prefix, turns)
        v = verify_trajectory(turns, job.script, self.config, parse_error)
        if v.violation is None:
            self._emit(job, v)
            return
        self._reject(job, "trajectory", v.violation)
        c = self.config
        if v.violation.rule == "corrections":
            if job.regenerations < c.max_regenerations and self._budget_left(job):
                job.regenerations += 1
                self.stats.regenerations += 1
                job.stage, job.prefix = "regeneration", []
                job.prompt = regeneration_prompt(job.script, v.turns, v.violation, c)
                return
        elif job.continuations < c.max_continuations and self._budget_left(job):
            job.continuations += 1
            self.stats.continuations += 1
            job.stage, job.prefix = "continuation", list(v.turns)
            job.prompt = continuation_prompt(job.script, v.turns, v.violation, c)
            return
        self._fail(job, "trajectory", f"{v.violation.rule}: {v.violation.detail}")

    def _emit(self, job: _Job, v: Verification) -> None:
        assert job.script is not None
        job.done = True
        source = {
            "persona": asdict(job.persona),
            "script": job.script.to_json(),
            "model": self.generator.name,
            "verification": {
                "corrections": v.corrections,
                "flagged_turns": list(v.flagged),
                # the DM's judgement of each player turn (index of the judged player turn), for curation
                "evaluations": [
                    {"player_turn": i - 1, "thought": t.get("thought", ""), **t["evaluation"]}
                    for i, t in enumerate(v.turns) if i % 2 == 0 and i > 0
                ],
                "dropped_turns": v.dropped,
                "final_observation": v.turns[-1]["observation"],
                "continuations": job.continuations,
                "regenerations": job.regenerations,
                "script_attempts": job.script_attempts,
                "rejections": job.history,
            },
            "cost": job.cost(),
            "config": asdict(self.config),
        }
        sample = to_sample(job.persona, job.script, v, source)
        self.stats.rows += 1
        self.samples.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)


def generate(
    generator: Generator,
    personas: Sequence[Persona],
    config: RefineConfig | None = None,
    scripts: Sequence[Script | None] | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    on_batch: Callable[[RefineStats], None] | None = None,
) -> RefineResult:
    """Refinement samples for `personas` (one attempt each, at most one sample each).

    `scripts` (same length, optional) skips script generation for personas whose entry is a
    checked Script (e.g. hand-written, or kept from an earlier run). `on_sample` sees each one as soon
    as it is verified (the CLI streams them to disk); `on_batch` sees the stats after every model call
(progress, and a cancel: an exception it raises stops the run). Generator errors propagate, except a
    prompt too long for the model (ContextOverflow): that persona fails under the rule "context"."""
    config = config or RefineConfig()
    if scripts is not None and len(scripts) != len(personas):
        raise ValueError(f"{len(scripts)} scripts for {len(personas)} personas")
    stats = RefineStats(personas=len(personas))
    jobs = []
    for i, persona in enumerate(personas):
        script = scripts[i] if scripts is not None else None
        if script is None:
            jobs.append(_Job(i, persona, None, script_prompt(persona, config), "script"))
        else:
            jobs.append(_Job(i, persona, script, trajectory_prompt(script, config), "trajectory"))
    start = time.monotonic()
    pipeline = _Pipeline(generator, config, stats, on_sample, on_batch)
    pipeline.run(jobs)
    stats.wall_s = time.monotonic() - start
    return RefineResult(pipeline.samples, pipeline.failures, stats)


def summary(s: dict[str, Any]) -> list[str]:
    """Human-readable counts, costs and rejections of one run (`s`: `RefineStats.to_dict()`)."""

    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    head = f"refine: {s['personas']} personas -> {s['rows']} rows, {s['failed']} failed"
    cost = f"cost: {s['calls']} model calls in {s['batches']} batches ({counts(s['calls_by_stage'])})"
    tokens = f"{s['completion_tokens']} completion tokens, {s['prompt_chars']} prompt chars"
    retries = f"retries: {s['script_retries']} script, {s['continuations']} continuations"
    return [
        f"{head} ({counts(s['failures_by_stage'])}) in {s['wall_s']:.1f}s",
        f"{cost}; {tokens}",
        f"{retries}, {s['regenerations']} regenerations; {s['scripts_kept']} scripts kept",
        f"rejections: script [{counts(s['script_rejections'])}]; trajectory [{counts(s['trajectory_rejections'])}]",
    ]
