"""services/coordination/peer_routes.py: where an instance dials the others (the
--peer-routes-file a chaos run writes), read again when the file changes."""

from __future__ import annotations

import json
import os

import pytest

from services.coordination.peer_routes import CHECK_INTERVAL_S, PeerRoutes, parse_routes


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path, routes, mtime_ns: int) -> None:
    path.write_text(routes if isinstance(routes, str) else json.dumps(routes))
    os.utime(path, ns=(mtime_ns, mtime_ns))  # a distinct mtime each write, whatever the filesystem's resolution


def test_without_a_file_every_address_is_dialled_as_registered():
    assert PeerRoutes("").dialled("10.0.0.1:7300") == "10.0.0.1:7300"


def test_a_routed_address_is_dialled_at_its_route_and_others_as_registered(tmp_path):
    path = tmp_path / "routes.json"
    write(path, {"127.0.0.1:7001": "127.0.0.1:9001"}, 1_000_000_000)
    routes = PeerRoutes(str(path), Clock())
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"
    assert routes.dialled("127.0.0.1:7002") == "127.0.0.1:7002"


def test_a_changed_file_is_read_again_once_the_check_interval_passed(tmp_path):
    path, clock = tmp_path / "routes.json", Clock()
    routes = PeerRoutes(str(path), clock)
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:7001"  # written after the instance started
    write(path, {"127.0.0.1:7001": "127.0.0.1:9001"}, 1_000_000_000)
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:7001"  # not looked at again within the interval
    clock.now += CHECK_INTERVAL_S
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"
    write(path, {"127.0.0.1:7001": "127.0.0.1:9002"}, 2_000_000_000)
    clock.now += CHECK_INTERVAL_S
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9002"
    path.unlink()
    clock.now += CHECK_INTERVAL_S
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:7001"


@pytest.mark.parametrize("text", ["not json", "[]", '{"127.0.0.1:7001": 9001}', '{"127.0.0.1:7001": "somewhere"}'])
def test_a_file_that_cannot_be_used_keeps_the_routes_last_read(tmp_path, text):
    path, clock = tmp_path / "routes.json", Clock()
    write(path, {"127.0.0.1:7001": "127.0.0.1:9001"}, 1_000_000_000)
    routes = PeerRoutes(str(path), clock)
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"
    write(path, text, 2_000_000_000)
    clock.now += CHECK_INTERVAL_S
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"


@pytest.mark.parametrize("text, wrong", [("[1]", "JSON object"), ('{"a:1": "b"}', "not host:port"),
                                         ('{"a": "b:1"}', "not host:port")])
def test_parse_routes_says_what_is_wrong(text, wrong):
    with pytest.raises(ValueError, match=wrong):
        parse_routes(text)


def test_a_routes_file_that_cannot_even_be_looked_at_keeps_the_routes_last_read(tmp_path):
    folder, clock = tmp_path / "routes", Clock()
    folder.mkdir()
    write(folder / "peers.json", {"127.0.0.1:7001": "127.0.0.1:9001"}, 1_000_000_000)
    routes = PeerRoutes(str(folder / "peers.json"), clock)
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"
    (folder / "peers.json").unlink()
    folder.rmdir()
    folder.write_text("a file where the folder was")  # stat: NotADirectoryError, not FileNotFoundError
    clock.now += CHECK_INTERVAL_S
    assert routes.dialled("127.0.0.1:7001") == "127.0.0.1:9001"
