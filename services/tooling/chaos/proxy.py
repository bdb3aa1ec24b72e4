"""The chaos run's own network paths: a TCP proxy per service process on its
way to ZooKeeper, which the nemesis can cut (``partition_zookeeper``) while
clients and the other instances still reach the process directly, and one on
each path between two service processes (``partition_peers``: one cut off from
its peers; ``partition_minority``: a minority side cut off from the majority's
instances and from ZooKeeper), while clients still reach every process.

A cut is a black hole, as a partition is: bytes either way are read and
dropped, new connections are accepted and hear nothing, so the process's
ZooKeeper client times out rather than being told the connection closed.
Healing closes the connections that were cut (their streams lost bytes) and
forwards new ones again. Only the run's own loopback ports are touched.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Collection, Mapping
from pathlib import Path

from services.tooling.cluster import PEER_CALLER_KINDS, ProcessInfo

BUFFER_BYTES = 65536


class CuttableProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (host:port) until cut."""

    def __init__(self, target: str):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket | None]] = []
        self._closed = False
        self.accepted = 0  # connections accepted so far: whether the path is used at all
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """Forwards again; the connections open during the cut are closed
        first (their streams lost bytes). A proxy not cut is left alone."""
        if not self._cut.is_set():
            return
        with self._lock:
            pairs, self._pairs = self._pairs, []
            for pair in pairs:
                _close(*pair)
            self._cut.clear()

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not, on Linux)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = None
            if not self._cut.is_set():
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)
                except OSError:
                    client.close()  # the target itself is down (a kill_* fault): refused, as it would be
                    continue
            with self._lock:
                if upstream is None and not self._cut.is_set():  # healed meanwhile: this one would stay dark
                    client.close()
                    continue
                self._pairs = [pair for pair in self._pairs if pair[0].fileno() != -1]  # closed ones go
                self._pairs.append((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                if source is not None:
                    threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket | None) -> None:
        try:
            while True:
                data = source.recv(BUFFER_BYTES)
                if not data:
                    break
                if sink is not None and not self._cut.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            if not self._cut.is_set():  # cut: the other side hears nothing, not a close
                _close(source, sink)


def _close(*sockets: socket.socket | None) -> None:
    for sock in sockets:
        if sock is None:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class ZookeeperRoutes:
    """One CuttableProxy per service process, made when its command is built."""

    def __init__(self):
        self.proxies: dict[str, CuttableProxy] = {}

    def route(self, name: str, zookeeper: str) -> str:
        """The connection string ``name`` is given: its proxy's address (a chroot kept)."""
        hosts, slash, chroot = zookeeper.partition("/")
        proxy = self.proxies.get(name)
        if proxy is None:
            proxy = self.proxies[name] = CuttableProxy(hosts.split(",")[0])
        return proxy.address + slash + chroot

    def cut(self, name: str) -> None:
        self.proxies[name].cut()

    def heal(self, name: str | None = None) -> None:
        for proxy_name, proxy in self.proxies.items():
            if name is None or proxy_name == name:
                proxy.heal()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


class PeerPaths:
    """One CuttableProxy per direction between two service processes, on the
    paths their calls to each other take (never on a client's): each process
    that dials others is given a routes file naming its own proxies
    (services/coordination/peer_routes.py), so cutting a set of processes off
    from the rest cuts both directions while clients and ZooKeeper still reach
    every one of them."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proxies: dict[tuple[str, str], CuttableProxy] = {}  # (caller, callee) -> its proxy

    def routes_file(self, name: str) -> str:
        """The routes file of process ``name`` (written by ``connect``)."""
        return str(self.directory / f"{name}.json")

    def connect(self, services: Mapping[str, ProcessInfo]) -> None:
        """A proxy on each path between the cluster's service processes (made
        once per pair: a process keeps its address when started again), and
        every caller's routes file written with them."""
        instances = {name: info for name, info in services.items() if info.kind != "zookeeper"}
        for caller, info in instances.items():
            if info.kind not in PEER_CALLER_KINDS:
                continue
            routes = {}
            for callee, target in instances.items():
                if callee == caller:
                    continue
                proxy = self.proxies.get((caller, callee))
                if proxy is None:
                    proxy = self.proxies[(caller, callee)] = CuttableProxy(target.address)
                routes[target.address] = proxy.address
            path = Path(self.routes_file(caller))
            staged = path.with_suffix(".tmp")
            staged.write_text(json.dumps(routes, sort_keys=True))
            os.replace(staged, path)  # a reader sees the old file or the new one, whole

    def cut(self, side: Collection[str]) -> None:
        """Cuts every path between a process of ``side`` and one outside it."""
        for (caller, callee), proxy in self.proxies.items():
            if (caller in side) != (callee in side):
                proxy.cut()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
