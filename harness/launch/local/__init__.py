"""The local backend: a cell's ranks as processes on this machine (launchers.py), forked from a warm interpreter on
CPU profiles (prefork.py)."""
