"""Files, environment substitution, YAML errors, the secure file and change detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodepool_k8s.config import loader
from nodepool_k8s.config.loader import (
    config_fingerprint, load_config, load_config_text, mark,
)
from nodepool_k8s.config.model import ZkServer
from nodepool_k8s.core.errors import ConfigError
from tests.config.common import FIXTURES, base, dump

ENV = {"NODEPOOL_ZK_HOST": "zk.example.com", "NODEPOOL_ZK_PORT": "2182",
       "NODEPOOL_ZK_CHROOT": "np"}
MINIMAL = str(FIXTURES / "minimal.yaml")


@pytest.fixture(autouse=True)
def _fast_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "READ_RETRY_DELAY", 0.0)


def _error(*args: object, **kw: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kw)  # type: ignore[arg-type]
    return info.value


# -- files ---------------------------------------------------------------------------------------


def test_load_config_records_absolute_sources() -> None:
    config = load_config(os.path.relpath(MINIMAL), env={})
    assert config.sources == (MINIMAL,)
    assert list(config.labels) == ["small"]


def test_missing_main_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    error = _error(missing, env={})
    assert error.path == missing
    assert error.problems == ["cannot read the file: it does not exist"]
    assert str(error) == f"{missing}: cannot read the file: it does not exist"


def test_missing_file_is_retried_for_editor_races(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "late.yaml"
    calls = []

    def sleep(seconds: float) -> None:  # the file appears while the loader waits
        calls.append(seconds)
        target.write_text(Path(MINIMAL).read_text())

    monkeypatch.setattr(loader.time, "sleep", sleep)
    assert load_config(str(target), env={}).providers["fake"].driver == "fake"
    assert len(calls) == 1


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    assert _error(str(tmp_path), env={}).problems[0].startswith("cannot read the file:")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8 text" in _error(str(binary), env={}).problems[0]


def test_missing_secure_file(tmp_path: Path) -> None:
    error = _error(MINIMAL, str(tmp_path / "secure.yaml"), env={})
    assert error.path == str(tmp_path / "secure.yaml")


# -- YAML ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,problem", [
    # The wording comes from (C or pure-Python) PyYAML; the position is ours.
    ("zookeeper-servers:\n  - host: a\n  bad: [\n", "invalid YAML at line 3, column 3: "),
    ("a: b\n c: d\n", "invalid YAML at line 2, column 3: mapping values are not allowed"),
    ("labels:\n  - name: a\n    name: b\n",
     "invalid YAML at line 3, column 5: duplicate key 'name' (first at line 2)"),
    ("- just\n- a list\n", "expected a mapping at the top of the file, got list"),
    ("", "zookeeper-servers: required key is missing"),
    ("x: !!python/object:os.system {}\n", "invalid YAML at line 1, column 4"),
])
def test_yaml_problems(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, path="f.yaml", env={})
    assert info.value.problems[0].startswith(problem), info.value.problems


def test_anchors_and_merge_keys_work() -> None:
    text = """
zookeeper-servers: [{host: zk}]
labels: [{name: a}, {name: b}]
providers:
  - name: p
    driver: fake
    pools:
      - name: main
        labels:
          - &small {name: a, cpu: 1}
          - <<: *small
            name: b
"""
    labels = load_config_text(text, env={}).providers["p"].pools["main"].labels
    assert (labels["a"].cpu, labels["b"].cpu) == (1, 1)


# -- environment substitution --------------------------------------------------------------------


def test_env_substitution() -> None:
    config = load_config(str(FIXTURES / "env.yaml"), env=ENV)
    assert config.zookeeper_servers == (ZkServer("zk.example.com", 2182, "/np"),)
    assert list(config.labels) == ["100% busy", "a 50% discount"]


def test_missing_env_var_names_variable_place_and_file() -> None:
    env = dict(ENV)
    del env["NODEPOOL_ZK_PORT"]
    error = _error(str(FIXTURES / "env.yaml"), env=env)
    assert error.path == str(FIXTURES / "env.yaml")
    assert error.problems == ["zookeeper-servers[0].port: environment variable"
                              " NODEPOOL_ZK_PORT is not set (line 4)"]
    assert str(error).startswith(str(FIXTURES / "env.yaml") + ": zookeeper-servers[0].port")


def test_an_env_value_that_is_not_utf8_is_one_clear_problem() -> None:
    """os.environ keeps undecodable bytes as lone surrogates: NODEPOOL_ZK_HOST=$'zk\\xff'
    used to fail later, in the installation id's hash, with a UnicodeEncodeError
    traceback."""
    env = dict(ENV, NODEPOOL_ZK_HOST="zk" + b"\xff".decode("utf-8", "surrogateescape"))
    error = _error(str(FIXTURES / "env.yaml"), env=env)
    assert error.problems == ["zookeeper-servers[0].host: environment variable"
                              " NODEPOOL_ZK_HOST is not valid UTF-8 (line 3)"]


def test_only_nodepool_variables_are_substituted() -> None:
    text = "zookeeper-servers: [{host: '%(HOME)s'}]\n"
    with pytest.raises(ConfigError) as info:
        load_config_text(text, path="f.yaml", env={"HOME": "/root"})
    (problem,) = info.value.problems
    assert problem.startswith("zookeeper-servers[0].host: %(HOME)s is not substituted: only"
                              " environment variables whose names start with NODEPOOL_")


def test_escaped_percent_keeps_tokens_literal() -> None:
    text = "zookeeper-servers: [{host: zk}]\nlabels: [{name: '%%(NODEPOOL_X)s'}]\n"
    config = load_config_text(text, env={"NODEPOOL_X": "no"})
    assert list(config.labels) == ["%(NODEPOOL_X)s"]


def test_mark_replaces_tokens_by_inert_markers_with_their_lines() -> None:
    text, tokens = mark("a: %(NODEPOOL_A)s\nb: %(NODEPOOL_B)s %% %\n")
    assert text == "a: __nodepool_k8s_env_0__\nb: __nodepool_k8s_env_1__ __nodepool_k8s_env_2__ %\n"
    assert tokens == [("NODEPOOL_A", 1), ("NODEPOOL_B", 2), (None, 2)]


def test_load_config_text_defaults_to_the_process_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEPOOL_TEST_HOST", "from-env")
    config = load_config_text("zookeeper-servers: [{host: '%(NODEPOOL_TEST_HOST)s'}]\n")
    assert config.zookeeper_servers[0].host == "from-env"


# -- secure file ---------------------------------------------------------------------------------


def test_secure_file_overrides_zookeeper(tmp_path: Path) -> None:
    main = tmp_path / "main.yaml"
    data = base()
    data["zookeeper-servers"] = [{"host": "plain", "chroot": "/a"}, {"host": "other"}]
    main.write_text(dump(data))  # invalid on its own (two chroots), replaced by the secure file
    for name in ("c", "k", "ca"):
        (tmp_path / name).write_text("pem")
    secure = tmp_path / "secure.yaml"
    secure.write_text(dump({"zookeeper-servers": [{"host": "zk-secure", "port": 2281}],
                            "zookeeper-tls": {"cert": str(tmp_path / "c"),
                                              "key": "%(NODEPOOL_KEY)s",
                                              "ca": str(tmp_path / "ca")}}))
    config = load_config(str(main), str(secure), env={"NODEPOOL_KEY": str(tmp_path / "k")})
    assert config.zookeeper_servers == (ZkServer("zk-secure", 2281, None),)
    assert config.zookeeper_tls is not None and config.zookeeper_tls.key == str(tmp_path / "k")
    assert config.sources == (str(main), str(secure))


def test_secure_file_may_supply_the_required_servers(tmp_path: Path) -> None:
    data = base()
    del data["zookeeper-servers"]
    main = tmp_path / "main.yaml"
    main.write_text(dump(data))
    config = load_config(str(main), str(FIXTURES / "secure.yaml"), env={})
    assert config.zk_hosts() == "zk-secure:2281/secure"
    assert _error(str(main), env={}).problems == [
        "zookeeper-servers: required key is missing"]


@pytest.mark.parametrize("secure,problem", [
    ({"providers": []}, "providers: unknown key; the secure file may only set"
                        " zookeeper-servers, zookeeper-tls, zookeeper-auth and"
                        " zookeeper-acl"),
    ({"zookeeper-servers": [{"host": "zk", "port": "x"}]},
     "zookeeper-servers[0].port: expected int, got 'x'"),
    ({"zookeeper-servers": [{"host": "a", "chroot": "/a"}, {"host": "b", "chroot": "/b"}]},
     "zookeeper-servers: all servers must name the same chroot"),
    ({"zookeeper-tls": {"cert": "/nonexistent/c", "key": "/nonexistent/k",
                        "ca": "/nonexistent/ca"}},
     "zookeeper-tls.cert: cannot read '/nonexistent/c'"),
    ([1], "expected a mapping at the top of the file, got list"),
])
def test_secure_file_problems_name_the_secure_file(tmp_path: Path, secure: object,
                                                   problem: str) -> None:
    path = tmp_path / "secure.yaml"
    path.write_text(dump(secure))
    error = _error(MINIMAL, str(path), env={})
    assert error.path == str(path)
    assert error.problems[0].startswith(problem), error.problems


def test_secure_file_may_carry_builder_diskimages_and_be_empty(tmp_path: Path) -> None:
    path = tmp_path / "secure.yaml"
    path.write_text("diskimages:\n  - name: x\n    env-vars: {A: b}\n")
    assert load_config(MINIMAL, str(path), env={}).zk_hosts() == "localhost:2181"
    path.write_text("# nothing here\n")
    assert load_config(MINIMAL, str(path), env={}).zk_hosts() == "localhost:2181"


# -- error format --------------------------------------------------------------------------------


def test_error_lines_name_file_place_and_expected_type() -> None:
    error = _error(str(FIXTURES / "broken.yaml"), env={})
    path = str(FIXTURES / "broken.yaml")
    assert error.problems == [
        "zookeeper-servers[0].port: expected int, got 'twenty'",
        "providers[0].pools[0].labels[0].cpu: expected number, got 'two'",
        "providers[0].pools[1].labels[0].imagee: unknown key (did you mean 'image'?)",
    ]
    assert str(error).splitlines() == [f"{path}: {p}" for p in error.problems]


# -- change detection ----------------------------------------------------------------------------


def test_fingerprint_changes_with_either_file(tmp_path: Path) -> None:
    main, secure = tmp_path / "main.yaml", tmp_path / "secure.yaml"
    main.write_text("a: 1\n")
    secure.write_text("b: 1\n")
    first = config_fingerprint(str(main), str(secure))
    assert [entry[0] for entry in first] == [str(main), str(secure)]
    assert config_fingerprint(str(main), str(secure)) == first
    secure.write_text("b: 12\n")  # size changes even within one mtime tick
    second = config_fingerprint(str(main), str(secure))
    assert second != first
    os.utime(main, ns=(1, 1))
    assert config_fingerprint(str(main), str(secure)) != second
    main.unlink()
    assert config_fingerprint(str(main))[0] == (str(main), None, None)


@pytest.mark.parametrize("value", [
    "ns\n    min-ready: 5",  # a new key
    "ns}, {name: evil",  # closes the flow mapping and adds a label
    "ns\n  - name: evil",  # a new list item
    "ns #comment",
    "'ns'",
    "&anchor ns",
    "!!python/object/apply:os.system [ls]",
])
def test_environment_values_cannot_inject_yaml(value: str) -> None:
    head = "zookeeper-servers: [{host: zk}]\n"
    block = head + "labels:\n  - name: %(NODEPOOL_LABEL)s\n"
    flow = head + "labels: [{name: '%(NODEPOOL_LABEL)s'}]\n"
    for text in (block, flow):
        config = load_config_text(text, env={"NODEPOOL_LABEL": value})
        assert list(config.labels) == [value]
        assert config.labels[value].min_ready == 0


def test_whole_plain_token_is_typed_like_yaml_but_never_structured() -> None:
    text = ("zookeeper-servers:\n  - host: zk\n    port: %(NODEPOOL_ZK_PORT)s\n"
            "labels:\n  - name: %(NODEPOOL_LABEL)s\n  - name: '%(NODEPOOL_QUOTED)s'\n")
    env = {"NODEPOOL_ZK_PORT": "2182", "NODEPOOL_LABEL": "{a: 1}", "NODEPOOL_QUOTED": "7"}
    config = load_config_text(text, env=env)
    assert config.zookeeper_servers[0].port == 2182
    # A mapping-looking value stays text; a quoted token stays a string.
    assert list(config.labels) == ["{a: 1}", "7"]
    with pytest.raises(ConfigError, match="expected int"):
        load_config_text(text, env={**env, "NODEPOOL_ZK_PORT": "[2182]"})


def test_values_are_not_substituted_again() -> None:
    text = "zookeeper-servers: [{host: '%(NODEPOOL_A)s'}]\n"
    config = load_config_text(text, env={"NODEPOOL_A": "%(NODEPOOL_B)s %%",
                                         "NODEPOOL_B": "no"})
    assert config.zookeeper_servers[0].host == "%(NODEPOOL_B)s %%"
