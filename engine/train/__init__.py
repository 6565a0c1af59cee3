"""Training the next policy: DPO / SFT / RFT over TRL (dpo, sft, common), the job runner that runs
them in their own processes with their state in the store (jobs, worker), `run_training` (training:
the one path from a job config to a registered model, for jobs and `train --foreground`), and the
iteration loops (iterate: Agent Q's Algorithm 1 and Agent-R). The commands are in engine.cli."""
