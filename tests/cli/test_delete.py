"""`nodepool delete`: default (the launcher deletes), --now (here, through the provider),
refusal of nodes Zuul has locked, --force (breaking the lock), unknown ids and failures.

Where the launcher finishes what the command began, its cleanup worker runs one pass on
the test's thread (tests/launcher/upkeep/support.py) instead of a running launcher."""

from __future__ import annotations

import json

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver import registry
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.cache import CacheEvent
from nodepool_k8s.zk.client import ZkClient
from tests.cli.conftest import (CONFIG, MIN_READY, Cli, fake_provider, foreign_node,
                                lock_contenders, node_data, node_state, ready_node, record)
from tests.helpers import ZkConnection, in_use
from tests.launcher.upkeep.support import Upkeep, make_upkeep
from tests.launchers import LauncherFactory

FAST = ("--lock-timeout", "0.2")


def _share_cloud(monkeypatch: pytest.MonkeyPatch, launcher: Launcher) -> list[FakeProvider]:
    """Make the CLI's fake provider see the launcher's (in-memory) cloud."""
    built: list[FakeProvider] = []
    cloud = fake_provider(launcher).cloud

    def factory(config: ProviderConfig, clock: Clock) -> FakeProvider:
        provider = FakeProvider(config, clock=clock, cloud=cloud)
        built.append(provider)
        return provider

    monkeypatch.setitem(registry.DRIVERS, "fake", factory)
    return built


def deleted_by_the_launcher(world: Upkeep, node_id: str) -> bool:
    """One pass of the launcher's cleanup after the node's change reached its cache."""
    world.cleanup.on_node_event(CacheEvent.CHANGED, node_id)
    world.step()
    return world.record(node_id) is None


def test_default_marks_deleting_and_the_launcher_deletes(
        cli: Cli, zk: ZkConnection, zkc: ZkClient) -> None:
    world = make_upkeep(zk, zkc, CONFIG)
    node_id = world.node("ready")
    external_id = f"main-{node_id}"
    assert external_id in world.fake.resource_ids()

    result = cli("delete", node_id)
    assert (result.code, result.err) == (0, "")
    row = result.table()[0]
    assert row[0] == node_id and row[6] == "deleting" and row[8] == "unlocked"
    assert deleted_by_the_launcher(world, node_id)
    assert external_id not in world.fake.resource_ids()


def test_short_ids_are_accepted(cli: Cli, launchers: LauncherFactory,
                                kazoo_client: KazooClient) -> None:
    launchers(MIN_READY)
    node_id = ready_node(kazoo_client)
    result = cli("delete", str(int(node_id)))
    assert result.code == 0 and result.table()[0][0] == node_id


def test_now_deletes_resource_and_znode(cli: Cli, launchers: LauncherFactory,
                                        kazoo_client: KazooClient,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = launchers(MIN_READY)
    built = _share_cloud(monkeypatch, launcher)
    node_id = ready_node(kazoo_client)
    external_id = f"main-{node_id}"

    result = cli("delete", node_id, "--now")
    assert (result.code, result.err) == (0, "")
    assert result.table()[0][6] == "deleted"
    # Done in the foreground: gone when the command returns, through the CLI's provider.
    assert kazoo_client.exists(paths.node_path(node_id)) is None
    assert external_id not in fake_provider(launcher).resource_ids()
    assert [p.call_names() for p in built] == [["start", "delete", "stop"]]
    assert fake_provider(launcher).call_names().count("delete") == 0


def test_now_failure_leaves_the_node_deleting_for_its_launcher(
        cli: Cli, zk: ZkConnection, zkc: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_upkeep(zk, zkc, CONFIG)
    cloud = world.fake.cloud

    def failing(config: ProviderConfig, clock: Clock) -> FakeProvider:
        provider = FakeProvider(config, clock=clock, cloud=cloud)
        provider.fail_next(op="delete", exc=TemporaryError("API unavailable"))
        return provider

    monkeypatch.setitem(registry.DRIVERS, "fake", failing)
    node_id = world.node("ready")
    result = cli("delete", node_id, "--now")
    assert result.code == 1 and result.out == ""
    assert result.err == (f"nodepool delete: could not delete main-{node_id} of node {node_id}"
                          " (API unavailable); the node stays in state deleting and its"
                          " launcher retries\n")
    # Unlocked and deleting: the launcher finishes the job.
    assert deleted_by_the_launcher(world, node_id)
    assert f"main-{node_id}" not in world.fake.resource_ids()


def test_now_needs_the_provider_in_the_configuration(cli: Cli,
                                                     kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    result = cli("delete", "--now", node_id)
    assert result.code == 1 and result.out == ""
    assert f"node {node_id} belongs to provider 'elsewhere', which is not in the" \
           f" configuration {cli.path}" in result.err
    assert len(result.err.splitlines()) == 1
    # Refused before anything changed; without --now it works (its launcher would delete).
    assert node_state(kazoo_client, node_id) == "ready"
    assert lock_contenders(kazoo_client, node_id) == []
    assert cli("delete", node_id).code == 0
    assert node_state(kazoo_client, node_id) == "deleting"


def test_refuses_a_node_zuul_has_locked(cli: Cli, launchers: LauncherFactory,
                                        zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    launchers()
    nodeset = in_use(zuul, ["small"])
    node_id = nodeset.nodes[0].id
    for extra in ((), ("--now",)):
        result = cli("delete", node_id, *FAST, *extra)
        assert result.code == 1 and result.out == ""
        assert result.err == (f"nodepool delete: node {node_id} is locked by another client"
                              " (in use?); use --force to delete it anyway\n")
    assert node_state(kazoo_client, node_id) == "in-use"
    assert nodeset.nodes[0].lock.is_acquired
    assert len(lock_contenders(kazoo_client, node_id)) == 1  # ours were removed
    zuul.release(nodeset)


def test_force_breaks_zuuls_lock(cli: Cli, zk: ZkConnection, zkc: ZkClient, zuul: ZuulClient,
                                 kazoo_client: KazooClient) -> None:
    world = make_upkeep(zk, zkc, CONFIG)
    worker, launches = world.pool_worker()
    request_id = zuul.submit(["small"])
    worker.run_once()
    launches.run_all()
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    node_id = nodeset.nodes[0].id
    zuul_contender = lock_contenders(kazoo_client, node_id)

    result = cli("delete", node_id, "--force", *FAST)
    assert result.code == 0
    assert result.err == (f"warning: node {node_id}: broke the lock held by another client"
                          " (removed 1 lock contender(s)); its holder loses the node\n")
    assert result.table()[0][6] == "deleting"
    assert not set(zuul_contender) & set(lock_contenders(kazoo_client, node_id))
    # Unlocked `deleting`: the launcher deletes resource and znode.
    assert deleted_by_the_launcher(world, node_id)
    assert f"main-{node_id}" not in world.fake.resource_ids()
    # Zuul finds out when it next writes the node; it cannot resurrect it.
    with pytest.raises(NoNodeError):
        zuul.release(nodeset)
    assert kazoo_client.exists(paths.node_path(node_id)) is None


def test_force_now_on_a_locked_node(cli: Cli, launchers: LauncherFactory, zuul: ZuulClient,
                                    kazoo_client: KazooClient,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = launchers()
    _share_cloud(monkeypatch, launcher)
    nodeset = in_use(zuul, ["large"])
    node_id = nodeset.nodes[0].id
    result = cli("delete", node_id, "--force", "--now", *FAST)
    assert result.code == 0 and "broke the lock" in result.err
    assert kazoo_client.exists(paths.node_path(node_id)) is None
    assert f"main-{node_id}" not in fake_provider(launcher).resource_ids()
    zuul.unlock(nodeset)  # Zuul's release of a vanished lock is harmless


def test_force_on_an_unlocked_node_is_a_plain_delete(cli: Cli,
                                                     kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    result = cli("delete", node_id, "--force")
    assert (result.code, result.err) == (0, "")
    assert node_state(kazoo_client, node_id) == "deleting"


def test_unknown_id(cli: Cli, kazoo_client: KazooClient) -> None:
    for args in (("0000000042",), ("42", "--now"), ("42", "--force")):
        result = cli("delete", *args)
        assert (result.code, result.out) == (1, "")
        assert result.err == "nodepool delete: node 0000000042 not found\n"
    # No lock dir or node znode was created on the way.
    assert kazoo_client.exists(paths.node_path("0000000042")) is None


def test_deleting_twice_is_harmless(cli: Cli, kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    assert cli("delete", node_id).code == 0
    result = cli("delete", node_id)
    assert result.code == 0 and result.table()[0][6] == "deleting"


def test_unreadable_record(cli: Cli, kazoo_client: KazooClient) -> None:
    kazoo_client.create(paths.node_path("0000000005"), b"", makepath=True)
    result = cli("hold", "5")
    assert result.code == 1
    assert result.err.splitlines()[-1] == (
        "nodepool hold: node 0000000005 has an unreadable record (empty or not a"
        " node); it cannot be changed with this command")
    result = cli("delete", "5")
    assert result.code == 1
    assert result.err.splitlines()[-1] == (
        "nodepool delete: node 0000000005 has an unreadable record (empty znode data);"
        " nothing in it can be trusted, so no launcher will delete it: use `nodepool"
        " delete --now 0000000005` to remove the record (only the record: nothing in the"
        " cluster is touched)")
    assert kazoo_client.exists(paths.node_path("0000000005")) is not None
    # Without a lock dir (none was ever made), --now locks it and removes both.
    result = cli("delete", "--now", "5")
    assert result.code == 0 and "removed its unreadable record (empty znode data)" in result.err
    assert kazoo_client.exists(paths.node_path("0000000005")) is None


def _hostile_copy(client: KazooClient, node_id: str, number: bytes) -> str:
    """A new node znode: the record of `node_id` (naming its resource) with `number` as
    its `created_time`, which no decoder may accept; returns its id."""
    data = json.dumps({**record(client, node_id), "created_time": 0}).encode()
    data = data.replace(b'"created_time": 0', b'"created_time": ' + number)
    path = client.create(f"{paths.NODES}/", data, sequence=True)
    client.create(paths.node_lock_path(paths.basename(path)), b"")  # a stale lock dir
    return paths.basename(path)


@pytest.mark.parametrize("number", [b"1e400", b"9" * 400, b"NaN"])
def test_now_removes_an_undecodable_record_and_nothing_else(
        cli: Cli, launchers: LauncherFactory, kazoo_client: KazooClient,
        number: bytes) -> None:
    launcher = launchers(MIN_READY)
    spare = ready_node(kazoo_client)
    hostile = _hostile_copy(kazoo_client, spare, number)

    listing = cli("list", "--json")
    assert listing.code == 0
    row = next(r for r in json.loads(listing.out, parse_constant=_refuse) if r["id"] == hostile)
    assert row["state"] == "malformed" and "created_time" in row["malformed"]

    result = cli("delete", hostile)
    assert result.code == 1 and "use `nodepool delete --now" in result.err
    assert kazoo_client.exists(paths.node_path(hostile)) is not None

    result = cli("delete", "--now", hostile)
    assert result.code == 0, result.err
    assert "removed its unreadable record" in result.err
    assert "no cluster resource was deleted" in result.err
    assert kazoo_client.exists(paths.node_path(hostile)) is None
    # The resource the record named (the spare's) is untouched, and so is the spare.
    assert f"main-{spare}" in fake_provider(launcher).resource_ids()
    assert node_state(kazoo_client, spare) == "ready"


def test_now_on_an_undecodable_record_locked_by_another_client(
        cli: Cli, kazoo_client: KazooClient) -> None:
    path = kazoo_client.create(f"{paths.NODES}/", b'{"state": "ready", "state_time": 1e999}',
                               sequence=True, makepath=True)
    node_id = paths.basename(path)
    kazoo_client.create(f"{paths.node_lock_path(node_id)}/x__lock__", b"", sequence=True,
                        makepath=True)
    result = cli("delete", "--now", node_id, *FAST)
    assert result.code == 1 and "locked by another client" in result.err
    assert kazoo_client.exists(path) is not None
    result = cli("delete", "--now", "--force", node_id)
    assert result.code == 0, result.err
    assert kazoo_client.exists(path) is None


def _refuse(name: str) -> None:
    raise ValueError(f"{name} in the output")


def test_now_refuses_a_resource_that_is_not_ours(cli: Cli, launchers: LauncherFactory,
                                                 kazoo_client: KazooClient,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The record names kube-system (the fake cloud holds it as foreign): nothing is deleted
    # in the cloud, the command says so, and the node record is removed all the same.
    launcher = launchers(MIN_READY)
    built = _share_cloud(monkeypatch, launcher)
    cloud = fake_provider(launcher).cloud
    cloud.foreign.add("kube-system")
    node_id = ready_node(kazoo_client)
    data = node_data(kazoo_client, node_id)
    assert data is not None
    kazoo_client.set(paths.node_path(node_id),
                     json.dumps(dict(data, external_id="kube-system")).encode())

    result = cli("delete", node_id, "--now", *FAST)
    assert result.code == 0
    assert result.err == (f"warning: node {node_id}: NOT deleting kube-system"
                          " of provider fake: kube-system is not ours (foreign); only the"
                          " node record is removed\n")
    assert result.table()[0][6] == "deleted"
    assert kazoo_client.exists(paths.node_path(node_id)) is None
    assert "kube-system" in cloud.foreign
    assert f"main-{node_id}" in fake_provider(launcher).resource_ids()  # left for the sweep
    assert [p.call_names() for p in built] == [["start", "delete", "stop"]]
