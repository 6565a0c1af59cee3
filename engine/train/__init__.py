"""Training the next policy: DPO / SFT / RFT over TRL (dpo, sft, common), the job runner that runs
them in their own processes with their state in the store (jobs, worker), the iteration loops
(iterate: Agent Q's Algorithm 1 and Agent-R), and the `orchard train|jobs|eval|iterate` commands
(cli_commands)."""
