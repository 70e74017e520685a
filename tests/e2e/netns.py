"""Network namespaces as "hosts" on this machine: one bridge, one veth pair per namespace, one private /24.

The bridge (in the machine's own namespace) holds the subnet's .1, where the shared Redis and PostgreSQL
listen; each namespace gets .2, .3, ... on its end of a veth pair and no other route, so its traffic can
reach the subnet and nothing else (no default route, no forwarding: it never leaves this machine). Names
carry a random run id, so concurrent runs never touch each other's links. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field

IP_TIMEOUT_S = 10
SUBNET_PREFIX = "10.231"  # 10.231.N.0/24, N picked among the subnets no link on this machine uses


class Unavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check)


def why_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason (not root, no iproute2, netns refused)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root or see docs/hosts.md"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (apt-get install iproute2)"
    probe = f"mbprobe{os.getpid()}"
    added = ip("netns", "add", probe, check=False)
    if added.returncode != 0:
        return f"`ip netns add` failed here: {added.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> str:
    used = ip("-4", "addr").stdout + ip("-4", "route").stdout
    candidates = [n for n in range(1, 255) if f"{SUBNET_PREFIX}.{n}." not in used]
    if not candidates:
        raise Unavailable(f"no free {SUBNET_PREFIX}.N.0/24 subnet on this machine")
    return f"{SUBNET_PREFIX}.{random.choice(candidates)}"


@dataclass
class Network:
    """A bridge with the shared services' address and one namespace per host name, removed by :meth:`remove`."""

    run_id: str = field(default_factory=lambda: f"{random.randrange(16**4):04x}")
    subnet: str = ""
    hosts: dict[str, str] = field(default_factory=dict)  # host name -> namespace
    addresses: dict[str, str] = field(default_factory=dict)  # host name -> its address in the subnet
    links: dict[str, str] = field(default_factory=dict)  # host name -> the link inside its namespace

    @property
    def bridge(self) -> str:
        return f"mb{self.run_id}br"

    @property
    def services_address(self) -> str:
        """The machine side of the subnet (the bridge): where Redis and PostgreSQL listen."""
        return f"{self.subnet}.1"

    def create(self, names: list[str]) -> Network:
        self.subnet = _free_subnet()
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.services_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for n, name in enumerate(names):
            self._add_host(name, n)
        return self

    def _add_host(self, name: str, n: int) -> None:
        namespace, outside, inside = f"mb{self.run_id}-{name}", f"mb{self.run_id}h{n}", f"mb{self.run_id}c{n}"
        ip("netns", "add", namespace)
        self.hosts[name] = namespace
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", namespace)
        ip("link", "set", outside, "master", self.bridge)
        ip("link", "set", outside, "up")
        address = f"{self.subnet}.{n + 2}"
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        ip("-n", namespace, "link", "set", inside, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        self.addresses[name], self.links[name] = address, inside

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``name``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.hosts[name], *argv]

    def pids(self, name: str) -> list[int]:
        """Every process in host ``name``'s namespace (only ever those this run started there)."""
        listed = ip("netns", "pids", self.hosts[name], check=False).stdout.split()
        return [int(p) for p in listed]

    def link_down(self, name: str) -> None:
        """Cut host ``name`` off the subnet."""
        ip("-n", self.hosts[name], "link", "set", self.links[name], "down")

    def link_up(self, name: str) -> None:
        ip("-n", self.hosts[name], "link", "set", self.links[name], "up")

    def remove(self) -> None:
        """Delete the veth pairs, the namespaces and the bridge; safe to call twice or after a failure.

        The host ends are deleted explicitly: a namespace outlives its name while the kernel tears it down."""
        for n in range(len(self.hosts)):
            ip("link", "del", f"mb{self.run_id}h{n}", check=False)
        for namespace in self.hosts.values():
            ip("netns", "del", namespace, check=False)
        with contextlib.suppress(subprocess.SubprocessError):
            ip("link", "del", self.bridge, check=False)
        self.hosts.clear()

    def leftovers(self) -> list[str]:
        """Links and namespaces of this run still present (empty after :meth:`remove`)."""
        mine = f"mb{self.run_id}"
        found = [line.split()[0] for line in ip("-br", "link").stdout.splitlines() if mine in line.split()[0]]
        found += [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.startswith(mine)]
        return found
