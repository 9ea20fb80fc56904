"""The detokenizer process: incremental detokenizing and stop strings."""
