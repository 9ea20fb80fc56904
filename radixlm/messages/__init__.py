"""The lowest floor: the plain data that crosses between radixlm's parts.

- io_struct.py: every message between processes (pickled over ZMQ);
- forward_step.py: the step contract between the scheduler and the model runner;
- generate_output.py: what the TokenizerManager yields to the APIs and the Engine;
- sampling_params.py, stop_regex.py: what a request asks for, validated, and what
  its stop regexes mean (the scheduler and the detokenizer match them alike);
- mm_inputs.py: the images and videos a request carries.

Nothing here imports from radixlm but `utils` and this package (see
docs/architecture.md and tests/test_import_graph.py).
"""
