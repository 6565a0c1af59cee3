"""`TinyConfig`: everything that determines the tiny model's weights.

Its own module so that the data builder (tiny_data) and the model builder (tiny) both read it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyConfig:
    """Everything that determines the tiny model's weights (stored with it; a change rebuilds)."""

    seed: int = 0
    # data (TextCraft train split, noisy expert)
    max_tasks: int | None = None  # None: every train task
    episodes_per_task: int = 3
    noise: float = 0.3  # expert mistake probability per step
    rename_fraction: float = 0.8  # episodes shown with item names swapped (see tiny_data)
    critic_fraction: float = 0.1  # chance of a critic row per expert step
    judge_fraction: float = 0.15  # chance of a judge row per expert step
    max_row_tokens: int = 1024  # longer rows are dropped from training
    compact: bool = True  # the expert's compact texts (TextCraftExpert(compact=True))
    chain: bool = True  # compact texts reasoning top-down from the goal (TextCraftExpert(chain=True))
    val_every: int = 10  # hold every val_every-th train task out of the rows (0: none; see tiny_data)
    # tokenizer + model
    # "word": each word of an item name is a piece ("lime", "carpet"); "name": each whole name is one
    # ("lime carpet"), so looking a name up in the task and copying it is one token's attention.
    name_pieces: str = "word"
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 704
    max_positions: int = 4096
    # optimisation
    steps: int = 4000
    batch_tokens: int = 3072
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    # DAgger (engine/llm/tiny_dagger.py): after the main training, `dagger_rounds` times roll the model
    # out on the train tasks, add the expert's labels of the states it reached, train `dagger_steps` more
    # steps (peak lr `dagger_lr`, same warm-up and cosine shape) on all rows so far.
    dagger_rounds: int = 1
    dagger_steps: int = 1000
    dagger_lr: float = 3e-4
    dagger_temperature: float = 1.0  # 0: greedy rollouts
    dagger_constrained: bool = True  # rollouts decoded under the action grammar (engine/grammar.py)
    dagger_max_steps: int = 10
    dagger_max_tokens: int = 160
    # Torch threads while training. Two, with OMP_WAIT_POLICY=PASSIVE (set in engine/__init__):
    # 1.6x faster than one on an idle 2-core machine and no slower under contention (measured).
    # Weights depend, in the last bits, on the thread count, so a fixed count keeps builds
    # identical everywhere.
    threads: int = 2
