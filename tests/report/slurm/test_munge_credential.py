"""The client's munge credential names the proxy it is for (issue 42): the payload
``slurm-gpu-proxy <URL>``, the URL in one canonical form the proxy compares with its
own. The munge command is replaced here; tests/proxy/test_proxy_munge.py runs the
real one against the real proxy."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.model.munge_wire import audience, payload
from slurm_gpu_exporter.report.cli import flags as cli_flags
from slurm_gpu_exporter.report.cli.client_config import CLIENT_ENV, load_client_config
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.slurm import munge as client_munge


@pytest.mark.parametrize(("url", "canonical"), [
    ("https://metrics.example.org:9818", "https://metrics.example.org:9818"),
    ("HTTPS://Metrics.Example.ORG:9818/", "https://metrics.example.org:9818"),
    ("https://metrics.example.org:443/", "https://metrics.example.org"),
    ("http://metrics.example.org:80", "http://metrics.example.org"),
    ("http://gateway.example.org/prometheus/", "http://gateway.example.org/prometheus"),
    ("http://user:pw@127.0.0.1:9818/?x=1#y", "http://127.0.0.1:9818"),
    ("http://[::1]:9818", "http://[::1]:9818"),
])
def test_a_proxy_url_has_one_canonical_form(url: str, canonical: str) -> None:
    assert audience(url) == canonical


@pytest.mark.parametrize("url", ["ftp://p:21", "http://", "p:9818", "http://p:port",
                                 "http://p:99999", ""])
def test_what_is_not_a_proxy_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        audience(url)


def _made(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append({"argv": argv, **kwargs})
        return subprocess.CompletedProcess(argv, 0, "MUNGE:AwQFAAB+abc:\n", "")

    monkeypatch.setattr(client_munge.subprocess, "run", run)
    return calls


def test_the_payload_names_the_proxy() -> None:
    assert payload("https://Metrics.example.org:9818/") == \
        "slurm-gpu-proxy https://metrics.example.org:9818"


def test_the_credential_carries_its_payload_on_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _made(monkeypatch)
    made = client_munge.munge_credential("slurm-gpu-proxy http://p:9818", "/run/m.sock",
                                         "/usr/bin/munge")
    assert made == "MUNGE:AwQFAAB+abc:"
    (call,) = calls
    assert call["input"] == "slurm-gpu-proxy http://p:9818"
    assert call["argv"] == ["/usr/bin/munge", "--socket=/run/m.sock"]  # no -n
    client_munge.munge_credential("slurm-gpu-proxy http://p:9818", restrict_uid=64123)
    assert calls[-1]["argv"][1:] == ["--restrict-uid=64123"]


def test_the_report_signs_for_the_url_it_asks(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "client.toml"
    config.write_text('prometheus_url = "https://proxy:9818"\nauth = "munge"\n'
                      'munge_restrict_uid = 64123\n')
    monkeypatch.setenv(CLIENT_ENV, str(config))
    monkeypatch.delenv("SLURM_GPU_REPORT_PROMETHEUS_URL", raising=False)
    calls = _made(monkeypatch)
    for argv, url in [([], "https://proxy:9818"),
                      (["--prometheus-url", "HTTP://Other:9818/"], "http://other:9818")]:
        args = cli_flags.build_parser().parse_args(["job", "1", *argv])
        conn = cli_flags.connection(args)
        assert conn.munge_credential is not None
        conn.munge_credential()
        assert calls[-1]["input"] == f"slurm-gpu-proxy {url}"
        assert calls[-1]["argv"][-1] == "--restrict-uid=64123"
    args = cli_flags.build_parser().parse_args(["job", "1", "--prometheus-url", "http://p:x"])
    with pytest.raises(ReportError, match="bad --prometheus-url 'http://p:x'"):
        cli_flags.connection(args)


@pytest.mark.parametrize("value", ["-1", "4294967295", '"64123"', "true", "1.5"])
def test_munge_restrict_uid_must_be_a_uid(tmp_path: Path, value: str) -> None:
    config = tmp_path / "client.toml"
    config.write_text(f"munge_restrict_uid = {value}\n")
    with pytest.raises(ReportError, match="munge_restrict_uid"):
        load_client_config(config)
