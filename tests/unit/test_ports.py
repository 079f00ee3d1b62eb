"""Rendezvous ports stay out of the kernel's ephemeral range, so a busy neighbour's sockets cannot take them."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from harness.core.ports import RANGE, derived_port, free_port


def test_the_range_lies_below_this_hosts_ephemeral_ports():
    lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert RANGE[1] < lo, f"ports {RANGE} overlap the ephemeral range {lo}-{hi}"


def test_a_derived_port_is_the_same_for_the_same_seed_and_spreads_over_the_range():
    ports = [derived_port(f"1234/0/{k}") for k in range(200)]
    assert ports == [derived_port(f"1234/0/{k}") for k in range(200)]
    assert all(RANGE[0] <= p <= RANGE[1] for p in ports)
    assert len(set(ports)) >= 195  # 200 cells of a pack: at most a few share a port by chance


def test_a_free_port_skips_one_that_is_held():
    rng = random.Random(7)
    held = free_port(random.Random(7))  # the first port this seed draws
    with socket.socket() as s:
        s.bind(("", held))
        s.listen()
        port = free_port(rng)
    assert port != held and RANGE[0] <= port <= RANGE[1]
