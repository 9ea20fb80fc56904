"""Model building blocks: linear layers, norms, RoPE, embeddings, attention backends."""
