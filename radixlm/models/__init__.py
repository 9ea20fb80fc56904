"""Model definitions that keep Hugging Face weight names, and the architecture registry."""
