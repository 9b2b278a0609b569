"""The proxy's settings: scopes of admins, users and coordinators; the trusted header."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu_exporter.proxy.config import ConfigError, load_config, parse_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yml"
    path.write_text(text)
    return path


def test_admins_users_and_coordinators_get_their_scopes(tmp_path: Path) -> None:
    path = write(tmp_path, "admins: [root]\npublic_metrics: [cluster:slurm_gpus:count]\n"
                           "account_users: {ml: [carol, dave]}\ncoordinators: {carol: [ml]}\n")
    config = load_config(path, "http://127.0.0.1:9090/", ["hpcadmin"], ["up"])
    assert config.prometheus_url == "http://127.0.0.1:9090"
    assert config.scope_for("root").admin and config.scope_for("hpcadmin").admin
    alice = config.scope_for("alice")
    assert not alice.admin and alice.users == {"alice"}
    assert alice.public == {"cluster:slurm_gpus:count", "up"}
    assert config.scope_for("carol").users == {"carol", "dave"}


@pytest.mark.parametrize(("text", "message"), [
    ("admins: [root]\nadmin: [bob]\n", "unknown key"),
    ("user_header: {name: X-Grafana-User}\n", "needs a proof"),
    ("user_header: {name: X-Grafana-User, secret_header: X-Secret}\n", "both"),
    ("admins: ['ro ot']\n", "not a user name"),
    ("- a\n", "mapping"),
])
def test_a_config_that_could_open_a_hole_is_refused(tmp_path: Path, text: str,
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), "http://127.0.0.1:9090", [], [])


def test_a_short_shared_secret_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("short\n")
    with pytest.raises(ConfigError, match="fewer than 16 bytes"):
        parse_config({"user_header": {"name": "X-Grafana-User", "secret_header": "X-S",
                                      "secret_file": "secret"}}, tmp_path)


def test_without_a_prometheus_url_the_proxy_says_which_flag_is_missing() -> None:
    with pytest.raises(ConfigError, match="--prometheus-url"):
        load_config(None, None, [], [])
