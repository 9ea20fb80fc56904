"""The web playground: one page at `GET /` (routes.py) and its files (static/)."""
