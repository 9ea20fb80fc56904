"""How radixlm is entered, by role.

- engine.py: the offline Engine (the serving processes without HTTP);
- launch.py, child_process.py, family_defaults.py: starting and watching the processes;
- http/: the HTTP app and what every route shares;
- native/, openai/, anthropic/, ollama/, playground/: the routes of each API.
"""
