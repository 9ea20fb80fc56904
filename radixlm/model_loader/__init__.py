"""Finding, converting (GGUF) and loading model weights."""
