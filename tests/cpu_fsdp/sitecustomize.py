"""Imported by every Python process started with this folder on PYTHONPATH (Python's `site` hook);
it acts only in the ranks of an `accelerate launch` (LOCAL_RANK set) when ORCHARD_TEST_CPU_FSDP
names a folder. tests/test_cpu_fsdp.py runs a real FSDP DPO job on two CPU processes with it:

- accelerate (1.16) keeps a CPU (gloo) group MULTI_CPU, which trains as DDP: `AcceleratorState`
  turns FSDP on only for GPU-like groups, although FSDP2 (`fully_shard`) runs on a CPU. Here a
  group launched with the FSDP plugin becomes an FSDP group; everything else (accelerate's FSDP2
  preparation, TRL's reference model and its wrapping, transformers' loading) is the installed code.
- The first reference pass of each rank (`OrchardDPOTrainer._reference_pass`, the one that scores
  every pair) writes `rank<N>.json` there: the model it scores with, and how far this rank's
  shard of each of its parameters is from the checkpoint's (safetensors) same rows.
- ORCHARD_TEST_ZERO_FILL=1 puts back the rank > 0 branch of earlier transformers 5.x loaders
  (`_move_missing_keys_from_meta_to_device`): under FSDP with cpu_ram_efficient_loading, every
  parameter and buffer of a rank > 0 is replaced by zeros after loading, for FSDP to fill from
  rank 0. The installed 5.25 keeps the loaded weights (it zero-fills non-persistent buffers only,
  and initialises them again): the test's negative control needs the older behaviour.
"""

from __future__ import annotations

import os

if os.environ.get("ORCHARD_TEST_CPU_FSDP") and os.environ.get("LOCAL_RANK") is not None:
    import inspect
    import json
    from pathlib import Path

    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    _state_init = AcceleratorState.__init__

    def _fsdp_on_cpu(self, *args, **kwargs):
        _state_init(self, *args, **kwargs)
        plugin = inspect.signature(_state_init).bind(self, *args, **kwargs).arguments.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = _fsdp_on_cpu

    if os.environ.get("ORCHARD_TEST_ZERO_FILL") == "1":
        from transformers import modeling_utils
        from transformers.integrations import is_fsdp_enabled

        _move = modeling_utils.PreTrainedModel._move_missing_keys_from_meta_to_device

        def _zero_fill(self, *args, **kwargs):
            _move(self, *args, **kwargs)
            if is_fsdp_enabled() and not modeling_utils.is_local_dist_rank_0():
                for key, param in list(self.named_parameters()):
                    modeling_utils._load_parameter_into_model(self, key, torch.zeros_like(param, device="cpu"))
                for key, buffer in list(self.named_buffers()):
                    modeling_utils._load_parameter_into_model(self, key, torch.zeros_like(buffer, device="cpu"))

        modeling_utils.PreTrainedModel._move_missing_keys_from_meta_to_device = _zero_fill

    from engine.train.trl_trainers import OrchardDPOTrainer

    _reference_pass = OrchardDPOTrainer._reference_pass

    def _recorded_pass(self, dataset, batch_size):
        out = Path(os.environ["ORCHARD_TEST_CPU_FSDP"]) / f"rank{self.accelerator.process_index}.json"
        if not out.exists():
            out.write_text(json.dumps(_reference_record(self)))
        return _reference_pass(self, dataset, batch_size)

    def _reference_record(trainer) -> dict:
        """This rank's shard of every reference parameter against the checkpoint's same rows
        (FSDP2 shards dim 0 as torch.chunk does)."""
        from safetensors.torch import load_file
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        model = trainer.ref_model if trainer.ref_model is not None else trainer.model
        folder = Path(model.config._name_or_path)
        checkpoint = load_file(folder / "model.safetensors")
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        worst, sharded, compared, local_abs = 0.0, 0, 0, 0.0
        for name, param in model.named_parameters():
            if name not in checkpoint:
                continue
            mine = param.to_local() if isinstance(param, DTensor) else param
            want = checkpoint[name].float()
            if isinstance(param, DTensor):
                sharded += 1
                want = torch.chunk(want, world, dim=0)[rank]
            compared += 1
            local_abs += float(mine.detach().abs().sum())
            if mine.shape != want.shape:
                worst = float("inf")
                continue
            worst = max(worst, float((mine.detach().float() - want).abs().max()))
        return {"rank": rank, "world": world, "distributed_type": str(trainer.accelerator.distributed_type),
                "ref_is_policy": trainer.ref_model is None, "fsdp_wrapped": isinstance(model, FSDPModule),
                "checkpoint": str(folder), "compared": compared, "sharded": sharded,
                "worst_abs_diff": worst, "local_abs_sum": local_abs,
                "cpu_ram_efficient_loading": os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")}

    OrchardDPOTrainer._reference_pass = _recorded_pass
