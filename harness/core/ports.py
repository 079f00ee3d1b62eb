"""Rendezvous ports: where rank 0's store listens, drawn where the kernel never hands out ports by itself.

Every port the harness picks lies in `RANGE`, below Linux's default ephemeral range (32768-60999,
`net.ipv4.ip_local_port_range`). The kernel hands ephemeral ports to every outgoing connection and to every socket
bound to port 0 — gloo binds one per pair of ranks — so a port drawn inside that range can be taken by a busy
neighbour between the draw and rank 0's bind, and the cell fails in torch's `_create_c10d_store` with EADDRINUSE
(seen in CI: a packed SLURM cell on a machine running two test suites). Below it, only a listener someone placed
there on purpose can collide.

`derived_port` is for ranks that cannot talk before the rendezvous (a SLURM job's tasks): each derives the same
port from the same seed. `free_port` is for a launcher that starts every rank itself: a port of the range nobody
holds now.
"""

from __future__ import annotations

import random
import socket

RANGE = (20000, 32767)
"""inclusive bounds of the ports drawn"""


def derived_port(seed: str) -> int:
    """The same port for the same seed on every node (a job id, a job/restart/cell key)."""
    return random.Random(seed).randint(*RANGE)


def free_port(rng: random.Random | None = None) -> int:
    """A port of RANGE that no socket on this host holds now (bound on every address, as rank 0's store binds);
    after 200 draws that all were taken, one the kernel picks."""
    rng = rng or random.SystemRandom()
    for _ in range(200):
        port = rng.randint(*RANGE)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
