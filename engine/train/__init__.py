"""Training the next policy: DPO / SFT / RFT over TRL (dpo, sft; what both share: common, tokens,
selection; trl_trainers, the one module that imports TRL, imported only inside the functions that
train), `run_training` (training: the one path from a job config to a registered model, for jobs and
`train --foreground`), and the iteration loops (iterate: Agent Q's Algorithm 1 and Agent-R). The job
runtime is engine.jobs; the commands are in engine.cli."""
