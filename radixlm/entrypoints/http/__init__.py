"""The HTTP server: the FastAPI app (server.py) and what every route shares: the
server's state and health (state.py), error bodies (errors.py, error_shapes.py),
request parsing and streaming (utils.py, strict.py), the API key, body size and
cross-site checks (middleware.py, security.py)."""
