"""Deletion, listing for the leak sweeper, and the shared watches' resilience.

Aspects: delete_and_confirm confirms the namespace is gone (missing = success, Terminating =
just wait), a hanging deletion raises TemporaryError after its timeout and succeeds once it
completes, API errors on delete are raised, not swallowed; list_resources returns only this
provider's namespaces with node id, creation time and deleting flag; the shared watches
survive a history compaction (410), broken watch requests and keep one stream per kind;
deletions are confirmed through the shared namespace watch (one API call each), also after
it re-lists, and a namespace without our labels through a watch on its name; `delete` is a
reconcile step: a Terminating namespace is answered as underway at once, the wake-up comes
when the watch sees it go, calling again is safe (one DELETE), and the provider keeps no
deadline of its own.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from kubernetes import client as k8s

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider
from nodepool_k8s.core.errors import NotOwned, QuotaExceeded, TemporaryError
from nodepool_k8s.driver.base import Gone, Underway
from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.kubernetes.conftest import FAST, ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

NS = make_label("k8s-namespace", "namespace")
POD = make_label("pod-fedora", image="docker.io/fedora:40")
NODE_ID = "0000000000"  # make_spec's default


def _launch(provider: KubernetesProvider, label: str = "k8s-namespace", **kw: Any) -> Any:
    return provider.launch(make_spec(provider.config, label, **kw), threading.Event())


def _admin_core(sim: Simulator, tmp_path: Any) -> k8s.CoreV1Api:
    from kubernetes import config as k8s_config
    path = sim.write_kubeconfig(tmp_path / "admin-kubeconfig")
    api_client = k8s_config.new_client_from_config(config_file=path, persist_config=False)
    return k8s.CoreV1Api(api_client)


# -- delete ------------------------------------------------------------------------------------

def test_delete_waits_until_gone(make_sim: Any, make_k8s_provider: ProviderFactory) -> None:
    sim = make_sim(namespace_delete_delay=0.3)
    provider = make_k8s_provider(sim, NS)
    result = _launch(provider)
    provider.delete_and_confirm(result.external_id)
    assert sim.get("namespaces", result.external_id) is None
    assert sim.list("secrets") == []  # no Secret is ever made (TokenRequest tokens)


def test_delete_missing_namespace_is_success(sim: Simulator,
                                             make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS)
    provider.delete_and_confirm("main-9999999999")


def test_concurrent_deletes_both_wait(make_sim: Any,
                                      make_k8s_provider: ProviderFactory) -> None:
    # The second DELETE meets a namespace that is already Terminating.
    sim = make_sim(namespace_delete_delay=0.3)
    provider = make_k8s_provider(sim, NS)
    result = _launch(provider)
    finished: list[str] = []

    def run() -> None:
        provider.delete_and_confirm(result.external_id)
        finished.append(result.external_id)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(finished) == 2
    assert sim.get("namespaces", result.external_id) is None


def test_hanging_deletion_raises_then_succeeds(sim: Simulator,
                                               make_k8s_provider: ProviderFactory,
                                               changes: Signal) -> None:
    # The deletion timeout runs on the provider's clock, which only the test moves: the
    # hanging deletion gives up once that clock has passed `delete-timeout`, not before.
    clock = ManualClock()
    provider = make_k8s_provider(sim, NS, clock=clock,
                                 settings=dataclasses.replace(FAST, delete_timeout=0.5))
    result = _launch(provider)
    sim.set_faults(namespace_delete_hang=True)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            provider.delete_and_confirm(result.external_id)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    changes.until(lambda: ((sim.get("namespaces", result.external_id) or {}).get("status") or {})
                  .get("phase") == "Terminating", message="the deletion to be under way")
    clock.advance(0.4)
    thread.join(0.1)  # given the chance, it must keep waiting: the timeout is not up
    assert thread.is_alive() and outcome == []
    clock.advance(0.2)
    thread.join(60)  # (only keeps a regression from hanging the run)
    assert not thread.is_alive(), "the deletion did not give up after its timeout"
    [error] = outcome
    assert isinstance(error, TemporaryError) and "deletion timeout" in str(error), error
    assert sim.get("namespaces", result.external_id)["status"]["phase"] == "Terminating"
    sim.set_faults(namespace_delete_hang=False)
    provider.delete_and_confirm(result.external_id)
    assert sim.get("namespaces", result.external_id) is None


def test_delete_errors_are_raised_not_swallowed(sim: Simulator,
                                                make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS, api_retries=1)
    result = _launch(provider)
    sim.fail_next("delete", "namespaces", count=2, code=500)
    with pytest.raises(TemporaryError):
        provider.delete_and_confirm(result.external_id)
    assert sim.get("namespaces", result.external_id)["status"]["phase"] == "Active"
    sim.fail_next("delete", "namespaces", count=1, code=403)
    with pytest.raises(TemporaryError):
        provider.delete_and_confirm(result.external_id)
    provider.delete_and_confirm(result.external_id)
    assert sim.get("namespaces", result.external_id) is None


def _delete_in_thread(provider: KubernetesProvider,
                      name: str) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            provider.delete_and_confirm(name)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _per_node(sim: Simulator) -> dict[str, int]:
    # Events are sent asynchronously and best-effort: not part of a node's API calls.
    return {k: v for k, v in sim.counters.items()
            if k != "total" and not k.startswith(("watch ", "list "))
            and not k.endswith(" events")}


def test_delete_survives_a_broken_namespace_watch(sim: Simulator,
                                                  make_k8s_provider: ProviderFactory,
                                                  changes: Signal) -> None:
    # The shared namespace watch ends every second; its next request fails (500), it lists
    # again after a backoff and the pending deletion is still confirmed through it.
    provider = make_k8s_provider(sim, NS, settings=dataclasses.replace(FAST, watch_timeout=1))
    result = _launch(provider)
    changes.until(lambda: provider._namespace_watch().get("", result.external_id) is not None,
                  message="the namespace watch to see the namespace")
    sim.set_faults(namespace_delete_hang=True)
    sim.reset_counters()
    sim.fail_next("watch", "namespaces", count=1, code=500)
    thread, outcome = _delete_in_thread(provider, result.external_id)
    changes.until(lambda: sim.counters.get("watch namespaces", 0) >= 2, timeout=10,
                  message="the namespace watch to be re-established")
    assert outcome == []
    sim.set_faults(namespace_delete_hang=False)
    thread.join(10)
    assert outcome == [None]
    assert sim.get("namespaces", result.external_id) is None
    assert sim.counters.get("list namespaces", 0) >= 1  # the watch re-listed
    # One DELETE (with the uid and resourceVersion preconditions); the ownership proof was
    # the namespace watch's copy.
    assert _per_node(sim) == {"delete namespaces": 1}, sim.counters


def test_delete_confirmed_after_the_namespace_watch_expires(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # 410 Gone on resuming: the cache is rebuilt from a list; the deletion completes while
    # the watch is away, so the re-list (without it) is confirmed by one read (404).
    provider = make_k8s_provider(sim, NS, settings=dataclasses.replace(FAST, watch_timeout=1))
    result = _launch(provider)
    sim.set_faults(namespace_delete_hang=True)
    sim.reset_counters()
    sim.fail_next("watch", "namespaces", count=1, code=410)
    thread, outcome = _delete_in_thread(provider, result.external_id)
    changes.until(lambda: sim.counters.get("list namespaces", 0) >= 1, timeout=10,
                  message="the namespace watch to list again")
    sim.set_faults(namespace_delete_hang=False)
    thread.join(10)
    assert outcome == [None]
    assert sim.get("namespaces", result.external_id) is None
    assert _per_node(sim).get("delete namespaces") == 1
    assert _per_node(sim).get("get namespaces", 0) <= 2  # the ownership proof + one check


def test_delete_of_a_namespace_without_our_labels_is_refused(
        make_sim: Any, make_k8s_provider: ProviderFactory, tmp_path: Any) -> None:
    # A name collision: not ours by label, so no DELETE is ever sent.
    sim = make_sim(namespace_delete_delay=0.3)
    provider = make_k8s_provider(sim, NS)
    _admin_core(sim, tmp_path).create_namespace(
        {"metadata": {"name": "main-0000000042", "labels": {"team": "x"}}})
    sim.reset_counters()
    with pytest.raises(NotOwned, match="nodepool_provider_name"):
        provider.delete_and_confirm("main-0000000042")
    assert sim.get("namespaces", "main-0000000042") is not None
    assert sim.counters.get("delete namespaces", 0) == 0


def test_delete_uses_one_call_and_no_new_watch(make_sim: Any,
                                               make_k8s_provider: ProviderFactory,
                                               changes: Signal) -> None:
    # With a real finalization delay the namespace is seen Terminating, then DELETED on the
    # shared watch: no per-deletion watch and no read (the ownership proof is the watch's
    # copy), however many deletions run at once.
    sim = make_sim(namespace_delete_delay=0.3)
    provider = make_k8s_provider(sim, NS)
    results = [_launch(provider, node_id=f"{i:010d}") for i in range(5)]
    changes.until(lambda: all(provider._namespace_watch().get("", r.external_id)
                              for r in results), message="the namespace watch to see them")
    sim.reset_counters()
    threads = [_delete_in_thread(provider, r.external_id) for r in results]
    for thread, _ in threads:
        thread.join(10)
    assert [outcome for _, outcome in threads] == [[None]] * 5
    assert all(sim.get("namespaces", r.external_id) is None for r in results)
    assert sim.counters.get("delete namespaces") == 5
    assert _per_node(sim) == {"delete namespaces": 5}, sim.counters
    assert sim.counters.get("watch namespaces", 0) == 0


# -- list_resources ----------------------------------------------------------------------------

def test_list_resources_sees_only_ours(sim: Simulator, make_k8s_provider: ProviderFactory,
                                       tmp_path: Any) -> None:
    provider = make_k8s_provider(sim, NS)
    other = make_k8s_provider(sim, NS, name="other-provider")
    mine = [_launch(provider, node_id=f"000000000{i}") for i in range(3)]
    theirs = _launch(other, node_id="0000000007")
    _admin_core(sim, tmp_path).create_namespace(
        {"metadata": {"name": "main-0000000008", "labels": {"team": "x"}}})
    before = time.time()

    resources = sorted(provider.list_resources(), key=lambda r: r.external_id)
    assert [r.external_id for r in resources] == [r.external_id for r in mine]
    assert [r.node_id for r in resources] == ["0000000000", "0000000001", "0000000002"]
    assert all(r.provider == "kubespray" and not r.deleting for r in resources)
    assert all(r.created is not None and abs(r.created - before) < 60 for r in resources)
    assert resources[0].metadata["nodepool_pool_name"] == "main"
    assert [r.external_id for r in other.list_resources()] == [theirs.external_id]


def test_list_resources_flags_terminating(make_sim: Any,
                                          make_k8s_provider: ProviderFactory) -> None:
    sim = make_sim(namespace_delete_delay=3600)
    provider = make_k8s_provider(sim, NS,
                                 settings=dataclasses.replace(FAST, delete_timeout=0.2))
    result = _launch(provider)
    with pytest.raises(TemporaryError):
        provider.delete_and_confirm(result.external_id)
    [resource] = provider.list_resources()
    assert resource.deleting


def test_list_resources_errors_are_temporary(sim: Simulator,
                                             make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS, api_retries=0)
    sim.fail_next("list", "namespaces", count=1, code=403)
    with pytest.raises(TemporaryError):
        provider.list_resources()
    sim.fail_next("list", "namespaces", count=1, code=500)
    with pytest.raises(TemporaryError):
        provider.list_resources()


# -- shared watches ----------------------------------------------------------------------------

def test_one_watch_per_kind_for_many_launches(sim: Simulator,
                                              make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS, POD)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results.append(_launch(provider, "pod-fedora", node_id=f"{i:010d}"))
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and len(results) == 20
    assert sim.open_watches == 2  # pods and namespaces, shared by every launch
    assert sim.counters.get("get pods", 0) == 0
    # No Secret is listed, watched or created: tokens come from TokenRequest.
    assert not [k for k in sim.counters if k.endswith(" secrets")], sim.counters
    assert sim.counters.get("create serviceaccounts/token") == 20


def test_watches_list_again_on_410(sim: Simulator, make_k8s_provider: ProviderFactory,
                                   changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS,
                                 settings=dataclasses.replace(FAST, watch_timeout=1))
    sim.reset_counters()
    sim.fail_next("watch", "pods", count=1, code=410)
    # The watch ends after 1 s; resuming is refused with 410 Gone, so the cache is rebuilt.
    changes.until(lambda: sim.counters.get("list pods", 0) >= 1, timeout=10,
                  message="the pod watch to list again")
    assert _launch(provider).external_id


def test_watches_recover_from_errors(sim: Simulator, make_k8s_provider: ProviderFactory,
                                     changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS, POD,
                                 settings=dataclasses.replace(FAST, watch_timeout=1))
    sim.fail_next("watch", "pods", count=2, code=500)
    changes.until(lambda: sim.counters.get("watch pods", 0) >= 3, timeout=15,
                  message="the pod watch to be re-established")
    assert _launch(provider, "pod-fedora").external_id


def test_stop_ends_watch_threads(sim: Simulator, make_k8s_provider: ProviderFactory,
                                 changes: Signal) -> None:
    # Streams the server keeps open for an hour: only the provider closing them ends them
    # (stop waits for each watch thread a few seconds at most, then returns regardless).
    provider = make_k8s_provider(sim, NS,
                                 settings=dataclasses.replace(FAST, watch_timeout=3600))
    changes.until(lambda: sim.open_watches == 2, message="the two shared watches to open")
    provider.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("k8s-watch-")
                and t.is_alive()]
    changes.until(lambda: sim.open_watches == 0, message="the watches to close")


# -- deletion as a reconcile step (no thread waits) -------------------------------------------

def test_delete_returns_underway_at_once_and_wakes_when_gone(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # A Terminating namespace is not waited for: Underway at once, the wake-up once the
    # shared watch sees it go, and asking again costs no API call.
    provider = make_k8s_provider(sim, NS)
    result = _launch(provider)
    name = result.external_id
    changes.until(lambda: provider._namespace_watch().get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.set_faults(namespace_delete_hang=True)
    sim.reset_counters()
    notices: list[str] = []
    underway = provider.delete(name, node_id=NODE_ID, wake=lambda: notices.append(name))
    assert isinstance(underway, Underway), underway
    assert underway.recheck_at > provider._clock.monotonic() and underway.stuck is None
    assert sim.get("namespaces", name)["status"]["phase"] == "Terminating"
    assert notices == []
    # Asked again while still Terminating: underway again, from the watch's copy.
    changes.until(lambda: (provider._namespace_watch().get("", name) or {}).get(
        "metadata", {}).get("deletionTimestamp"), message="the watch to see Terminating")
    again = provider.delete(name, node_id=NODE_ID, wake=lambda: notices.append("again"))
    assert isinstance(again, Underway), again
    sim.set_faults(namespace_delete_hang=False)
    changes.until(lambda: sorted(notices) == sorted([name, "again"]), timeout=10,
                  message="each wake-up, once")
    assert isinstance(provider.delete(name, node_id=NODE_ID,
                                      wake=lambda: notices.append("third")), Gone)
    assert sim.get("namespaces", name) is None
    # One DELETE; no read: the proof, the Terminating copy and the confirmation were all
    # the shared watch's.
    assert _per_node(sim) == {"delete namespaces": 1}, sim.counters
    assert sorted(notices) == sorted([name, "again"])


def test_delete_called_again_is_safe(sim: Simulator,
                                     make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # Calls in a row, right after the first (the watch may still hold the copy from before
    # the DELETE: a DELETE from it is refused by its preconditions), while Terminating and
    # once gone: every call answers without waiting, the namespace is deleted once, a
    # Terminating one gets no further DELETE and a gone one stays gone (no error).
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    uid = sim.get("namespaces", name)["metadata"]["uid"]
    sim.set_faults(namespace_delete_hang=True)
    answers = [provider.delete(name, node_id=NODE_ID) for _ in range(3)]
    assert all(isinstance(a, Underway) for a in answers), answers
    current = sim.get("namespaces", name)
    assert current["status"]["phase"] == "Terminating" and current["metadata"]["uid"] == uid
    changes.until(lambda: (provider._namespace_watch().get("", name) or {}).get(
        "metadata", {}).get("deletionTimestamp"), message="the watch to see Terminating")
    sim.reset_counters()
    for verify in (False, True):
        assert isinstance(provider.delete(name, node_id=NODE_ID, verify=verify), Underway)
    assert "delete namespaces" not in sim.counters, sim.counters
    sim.set_faults(namespace_delete_hang=False)
    # Without `verify` the watch's copy is the answer: gone once the watch has seen it go.
    changes.until(lambda: provider._namespace_watch().get("", name) is None,
                  message="the watch to see the namespace go")
    for verify in (True, False):
        assert isinstance(provider.delete(name, node_id=NODE_ID, verify=verify), Gone)
    assert "delete namespaces" not in sim.counters, sim.counters


def test_a_parked_deletion_nobody_finishes_leaves_nothing_behind(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # The node record of a parked deletion may be removed meanwhile (an operator, a lost
    # race): nobody calls delete again once the namespace is gone. What the provider tracked
    # for that deletion must go with the namespace, not stay for the process's lifetime.
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    changes.until(lambda: provider._namespace_watch().get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.set_faults(namespace_delete_hang=True)
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Underway)
    assert len(provider._terminating) == 1
    sim.set_faults(namespace_delete_hang=False)
    changes.until(lambda: sim.get("namespaces", name) is None, message="the namespace to go")
    changes.until(lambda: len(provider._terminating) == 0 and not provider._wakers,
                  message="the provider to forget the deletion")


def test_delete_keeps_no_deadline_and_verify_asks_the_api(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # The caller owns `delete-timeout`: asked again long after it, the provider still
    # answers from what is there (underway), never a timeout of its own; `verify` makes it
    # read the namespace from the API instead of the watch's copy.
    clock = ManualClock()
    provider = make_k8s_provider(sim, NS, clock=clock,
                                 settings=dataclasses.replace(FAST, delete_timeout=0.5))
    name = _launch(provider).external_id
    changes.until(lambda: provider._namespace_watch().get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.set_faults(namespace_delete_hang=True)
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Underway)
    changes.until(lambda: (provider._namespace_watch().get("", name) or {}).get(
        "metadata", {}).get("deletionTimestamp"), message="the watch to see Terminating")
    clock.advance(60.0)  # far past delete-timeout, within terminating-grace
    sim.reset_counters()
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Underway)
    assert _per_node(sim) == {}, sim.counters  # the watch's copy
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None,
                                      verify=True), Underway)
    assert _per_node(sim) == {"get namespaces": 1}, sim.counters
    sim.set_faults(namespace_delete_hang=False)
    # Gone once the watch has seen it go (without `verify` the watch's copy is the answer).
    changes.until(lambda: provider._namespace_watch().get("", name) is None,
                  message="the watch to see the namespace go")
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Gone)


def test_a_stale_watch_copy_does_not_block_the_confirmation(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # The namespace watch breaks for good after it saw the namespace Terminating (every new
    # list and watch fails), so its copy stays Terminating after the namespace is gone.
    # The deleter's verifying call (past its deadline) asks the API instead of trusting it.
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    watch = provider._namespace_watch()
    changes.until(lambda: watch.get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.set_faults(namespace_delete_hang=True)
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Underway)
    changes.until(lambda: (watch.get("", name) or {}).get("metadata", {}).get(
        "deletionTimestamp"), message="the watch to see Terminating")
    sim.fail_next("list", "namespaces", count=10**6, code=500)
    sim.fail_next("watch", "namespaces", count=10**6, code=500)
    sim.end_watches()
    sim.set_faults(namespace_delete_hang=False)
    changes.until(lambda: sim.get("namespaces", name) is None, message="the namespace to go")
    assert watch.get("", name) is not None  # stale
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None), Underway)
    assert isinstance(provider.delete(name, node_id=NODE_ID, wake=lambda: None,
                                      verify=True), Gone)  # confirmed by a GET


# -- job-role: cluster-role: the launcher's own hold ----------------------------------------------

def test_the_hold_goes_as_soon_as_it_is_alone_for_a_waiting_delete(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # `nodepool delete --now` waits in `delete`: the launcher's cleanup binding and its
    # finalizer must not keep that wait until `delete-timeout` (10 s here) or
    # `terminating-grace` (120 s): the hold goes once it is all that is left.
    provider = make_k8s_provider(sim, NS, job_role="cluster-role")
    name = _launch(provider).external_id
    binding = sim.get("rolebindings", manifests.CLEANUP_BINDING, name)
    assert binding is not None
    assert binding["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    assert binding["subjects"] == [{"kind": "User", "apiGroup": manifests.RBAC_GROUP,
                                    "name": "sim-admin"}]
    provider.delete_and_confirm(name, node_id=NODE_ID)
    assert sim.get("namespaces", name) is None


def test_a_failed_attempt_releases_the_hold_before_its_delete(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # No job ever saw a failed attempt's namespace: the hold goes before the DELETE, and
    # the attempt's clean-up confirms the namespace gone as before.
    provider = make_k8s_provider(sim, POD, job_role="cluster-role")
    sim.set_faults(quota_exceeded=True)  # the pod is refused: the attempt is discarded
    with pytest.raises(QuotaExceeded):
        _launch(provider, "pod-fedora")
    assert sim.counters.get("patch rolebindings") == 1
    assert not [n for n in sim.list("namespaces") if n["metadata"]["name"].startswith("main-")]
