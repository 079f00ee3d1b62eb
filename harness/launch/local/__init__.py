"""The local backend: a round's cells one after another (backend.py), a cell's ranks as processes on this machine
(launchers.py), forked from a warm interpreter on CPU profiles (prefork.py)."""
