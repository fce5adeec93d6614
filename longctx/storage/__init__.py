"""Files on disk: whole-or-absent writes and directory swaps (atomic.py), lock files judged by
their holder's liveness (locks.py) and Hub downloads into the Hugging Face cache (hub.py)."""
