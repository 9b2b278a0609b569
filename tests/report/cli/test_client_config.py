"""The client config on login nodes: where it is, what it may hold, and that the
command line wins over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.client_config import CLIENT_ENV, load_client_config
from slurm_gpu_exporter.report.cli.flags import build_parser, connection
from slurm_gpu_exporter.report.errors import ReportError


def _conn(argv: list[str]):  # type: ignore[no-untyped-def]
    return connection(build_parser().parse_args(["job", "1", *argv]))


def test_client_config_gives_url_auth_and_ca(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "client.toml"
    config.write_text('prometheus_url = "https://proxy:9818"\nauth = "munge"\n'
                      'ca_file = "/etc/ca.pem"\ntimeout_seconds = 12\n')
    monkeypatch.setenv(CLIENT_ENV, str(config))
    monkeypatch.delenv("SLURM_GPU_REPORT_PROMETHEUS_URL", raising=False)
    conn = _conn([])
    assert (conn.url, conn.ca_file, conn.timeout_s) == ("https://proxy:9818", "/etc/ca.pem",
                                                        12.0)
    assert conn.munge_credential is not None
    flags = _conn(["--prometheus-url", "http://other:9090", "--auth", "none",
                   "--timeout", "5"])
    assert (flags.url, flags.munge_credential, flags.timeout_s) == (
        "http://other:9090", None, 5.0)


def test_without_a_client_config_the_defaults_hold(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLIENT_ENV, str(tmp_path / "absent.toml"))
    monkeypatch.delenv("SLURM_GPU_REPORT_PROMETHEUS_URL", raising=False)
    conn = _conn([])
    assert (conn.url, conn.munge_credential, conn.timeout_s) == (
        "http://localhost:9090", None, 30.0)


@pytest.mark.parametrize("text", ['auth = "kerberos"\n', 'prometheus_urll = "x"\n',
                                  "timeout_seconds = true\n", "not toml"])
def test_a_bad_client_config_is_one_clear_error(tmp_path: Path, text: str) -> None:
    config = tmp_path / "client.toml"
    config.write_text(text)
    with pytest.raises(ReportError) as raised:
        load_client_config(config)
    assert str(config) in str(raised.value) and raised.value.exit_code == 2
