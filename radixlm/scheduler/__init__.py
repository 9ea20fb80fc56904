"""The scheduler process: requests, step plans, KV, policy, grammars, jump-forward, outputs."""
