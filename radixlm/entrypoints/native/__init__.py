"""The native routes: SGLang's `/generate` and friends (api.py), the routes under
SGLang's other names and `/v1/score` (sglang.py), and runtime control (control.py)."""
