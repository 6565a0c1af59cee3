"""The first observation of an episode as AgentGym's own env servers phrase it, per env.

AgentGym clients (agentenv/envs/*.py in WooooDyy/AgentGym) read only the observation text (and, for
SciWorld, "task_description") from /reset and /observation, never separate goal or context fields;
an agent served an Orchard env without its goal would be blind. So `serve-env` puts the task's goal
and context where each AgentGym server puts them:

- textcraft: "Crafting commands:\\n<recipes>\\n\\nGoal: craft <item>." (the env's own reset text is
  not part of AgentGym's observation);
- babyai: "Your goal: <mission>\\n<view>\\nAvailable actions: [\\"a\\", \\"b\\"]";
- scienceworld / sciworld: the observation as is, plus "task_description" in the /reset answer (the
  SciWorld client joins them as task_description + "\\n" + observation);
- any other env, in BabyAI's spirit: "Your goal: <goal>\\n<context>\\n<observation>".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from engine.envs.base import TaskSpec


def first_observation(env_name: str, task: TaskSpec, observation: str,
                      valid_commands: Callable[[], list[str]] | None = None) -> tuple[str, dict[str, Any]]:
    """(the observation to serve, extra fields for the /reset answer) for `env_name`'s AgentGym server."""
    goal = task.goal.strip().rstrip(".")
    context = task.context.strip()
    if env_name == "textcraft":
        commands = context if context.startswith("Crafting commands:") else f"Crafting commands:\n{context}"
        return f"{commands}\n\nGoal: {goal}.", {}
    if env_name in ("scienceworld", "sciworld"):
        return observation, {"task_description": "\n".join(p for p in (task.goal.strip(), context) if p)}
    head = f"Your goal: {goal}\n" + (f"{context}\n" if context else "")
    if env_name == "babyai" and valid_commands is not None:
        listed = ", ".join(json.dumps(c) for c in valid_commands())
        return f"{head}{observation}\nAvailable actions: [{listed}]", {}
    return f"{head}{observation}", {}
