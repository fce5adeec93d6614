"""Two network namespaces joined by a veth pair: two "nodes" on one machine, whose link can be
cut as a switch port or a cable fails (packets vanish, no reset reaches either side).

    from netns import TwoNodes, unavailable
    reason = unavailable()          # None, or why this machine cannot (not root, no `ip netns`)
    with TwoNodes("lcx") as nodes:  # namespaces lcx0 and lcx1, addresses nodes.address(0|1)
        proc = subprocess.Popen(nodes.wrap(1, [cmd...]), ...)   # runs on node 1
        nodes.cut()                 # node 1's link drops every packet, both ways

Each node has its own host name (NAME0, NAME1: a UTS namespace per command) that both resolve
(`ip netns exec` shows /etc/netns/NAME/hosts as /etc/hosts), as torchrun's rendezvous expects
of two machines. The cut is a zero-length queue on both ends of the pair (`tc qdisc ... pfifo limit 0`): every
packet is dropped on its way out, TCP sees silence and retransmits; nothing is reset.
Used by tests/integration/test_node_partition.py and the chaos soak (scripts/faults/chaos_soak.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

SUBNET = "10.231.{n}.{host}"
ETC_NETNS = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> Optional[str]:
    """Why two namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root to test a partitioned node"
    if any(shutil.which(tool) is None for tool in ("ip", "tc", "unshare", "hostname")):
        return "`ip`, `tc` (iproute2), `unshare` and `hostname` are needed to make two nodes and cut their link"
    probe = f"lcprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()[:200]}"
    try:
        link = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if link.returncode != 0:
            return f"no veth pairs here: {link.stderr.strip()[:200]}"
        cut = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "pfifo",
                              "limit", "0"], capture_output=True, text=True)
        if cut.returncode != 0:
            return f"cannot cut a link here (tc pfifo): {cut.stderr.strip()[:200]}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class TwoNodes:
    """Namespaces NAME0 and NAME1 (`net`: the third byte of their 10.231.x.0/24 subnet)."""

    def __init__(self, name: str, net: int = 0):
        self.names = [f"{name}0", f"{name}1"]
        self.links = [f"{name}v0", f"{name}v1"]
        self.net = net
        self.is_cut = False

    def address(self, node: int) -> str:
        return SUBNET.format(n=self.net, host=node + 1)

    def __enter__(self) -> "TwoNodes":
        self.close()  # namespaces a killed run left
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(n)} {ns}\n" for n, ns in enumerate(self.names))
        for ns in self.names:
            _ip("netns", "add", ns)
            (ETC_NETNS / ns).mkdir(parents=True, exist_ok=True)
            (ETC_NETNS / ns / "hosts").write_text(hosts)
        _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
        for node, (ns, link) in enumerate(zip(self.names, self.links)):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", link)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", link, "up")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ns in self.names:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        try:
            ETC_NETNS.rmdir()  # when this made it (nothing else there)
        except OSError:
            pass

    def wrap(self, node: int, cmd: list[str]) -> list[str]:
        """`cmd` run on `node`: inside its network namespace, under its host name."""
        return ["ip", "netns", "exec", self.names[node], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[node], *cmd]

    def env(self, node: int) -> dict[str, str]:
        """What a job's processes on `node` need to use its link (gloo picks the interface by name)."""
        return {"GLOO_SOCKET_IFNAME": self.links[node], "NCCL_SOCKET_IFNAME": self.links[node]}

    def cut(self) -> None:
        """Every packet on the link vanishes, both ways."""
        for ns, link in zip(self.names, self.links):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", link, "root", "pfifo", "limit",
                            "0"], check=True, capture_output=True)
        self.is_cut = True

    def heal(self) -> None:
        for ns, link in zip(self.names, self.links):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", link, "root"],
                           capture_output=True)
        self.is_cut = False
