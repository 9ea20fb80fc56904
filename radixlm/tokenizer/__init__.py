"""The HTTP-process side: TokenizerManager, request normalization, validation."""
