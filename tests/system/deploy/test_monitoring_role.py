"""The monitoring role, applied for real to this machine with ``connection: local``.

Every path the role writes is a role variable, pointed here into a temporary directory:
the machine's own /etc is not touched. Prometheus and Alertmanager are not running
here (no systemd), so the reload handlers are skipped; promtool and amtool check what
the role wrote. The tests build on each other in file order (first run, second run,
check mode, switches, removal).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO, move_aside, require, wait_until
from tests.support.agent import Agent
from tests.support.daemons import Prometheus, http_json

pytestmark = pytest.mark.process

ANSIBLE_DIR = REPO / "deploy" / "ansible"
VENV_BIN = Path(sys.executable).parent
RULES = ("slurm-gpu-exporter.rules.yml", "slurm-gpu-exporter.alerts.yml", "training.rules.yml")


class MonitoringHost:
    def __init__(self, base: Path, gpu_nodes: dict[str, dict[str, str]] | None = None) -> None:
        self.base = base
        self.etc = base / "etc"
        self.prom_config = self.etc / "prometheus" / "prometheus.yml"
        self.prom_dir = self.etc / "prometheus" / "slurm-gpu-exporter"
        self.am_config = self.etc / "prometheus" / "alertmanager.yml"
        self.grafana = self.etc / "grafana" / "provisioning"
        self.dashboards = base / "var" / "dashboards"
        self.systemd = self.etc / "systemd" / "system"
        self.systemd.mkdir(parents=True)
        self.review_env = self.etc / "default" / "slurm-gpu-report-review"
        self.review_env.parent.mkdir()
        self.inventory = base / "inventory.yml"
        self.inventory.write_text(json.dumps({"all": {"children": {
            "monitoring": {"hosts": {"localhost": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ansible_become": False}}},
            "gpu_nodes": {"hosts": gpu_nodes if gpu_nodes is not None else {
                "gpu-b": {"ansible_host": "10.0.0.2"}, "gpu-a": {}}},
        }}}))
        self.vars: dict[str, object] = {
            "slurm_gpu_monitoring_cluster": "testcluster",
            "slurm_gpu_monitoring_prometheus_config": str(self.prom_config),
            "slurm_gpu_monitoring_prometheus_dir": str(self.prom_dir),
            "slurm_gpu_monitoring_alertmanager_config": str(self.am_config),
            "slurm_gpu_monitoring_grafana_provisioning_dir": str(self.grafana),
            "slurm_gpu_monitoring_grafana_dashboards_dir": str(self.dashboards),
            "slurm_gpu_monitoring_systemd_dir": str(self.systemd),
            "slurm_gpu_monitoring_review_env_file": str(self.review_env),
            "slurm_gpu_monitoring_proxy": True,
            # Installing the package (into /opt) is shown with the default paths, below.
            "slurm_gpu_monitoring_install": False,
        }
        self.runs = 0

    def play(self, *args: str, **overrides: object) -> tuple[int, str, dict[str, int]]:
        self.runs += 1
        varfile = self.base / f"vars-{self.runs}.json"
        varfile.write_text(json.dumps({**self.vars, **overrides}))
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
               "ANSIBLE_HOME": str(self.base / "ansible-home"),
               "ANSIBLE_LOCAL_TEMP": str(self.base / "ansible-tmp"),
               "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), "site.yml",
             "--limit", "monitoring", "-e", f"@{varfile}", *args],
            cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        m = re.search(r"^localhost\s*:\s*(.*)$", out, re.MULTILINE)
        recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}
        return proc.returncode, out, recap

    def written(self) -> list[str]:
        return sorted(str(p.relative_to(self.base)) for p in self.base.rglob("*")
                      if p.is_file() and (p.is_relative_to(self.etc)
                                          or p.is_relative_to(self.dashboards)))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> MonitoringHost:
    for tool in ("promtool", "amtool"):
        require(shutil.which(tool) is not None, f"{tool} is missing: apt-get install "
                                                f"prometheus prometheus-alertmanager")
    return MonitoringHost(tmp_path_factory.mktemp("monitoring"))


def test_first_run_writes_config_rules_routes_provisioning_and_units(host: MonitoringHost) -> None:
    rc, out, recap = host.play()
    assert rc == 0, out[-4000:]
    assert recap["failed"] == 0 and recap["changed"] > 0
    config = yaml.safe_load(host.prom_config.read_text())
    assert config["global"]["external_labels"] == {"cluster": "testcluster"}
    targets = yaml.safe_load((host.prom_dir / "targets" / "gpu-nodes.yml").read_text())
    assert targets == [{"targets": ["gpu-a:9817", "10.0.0.2:9817"],  # by inventory name
                        "labels": {"cluster": "testcluster"}}]
    for name in RULES:
        assert (host.prom_dir / "rules" / name).read_bytes() == (
            REPO / "deploy" / "prometheus" / "rules" / name).read_bytes()
    shipped_routes = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
    assert host.am_config.read_bytes() == shipped_routes.read_bytes()
    ds = yaml.safe_load((host.grafana / "datasources" / "slurm-gpu-exporter.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://127.0.0.1:9090"
    provider = yaml.safe_load((host.grafana / "dashboards" / "slurm-gpu-exporter.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == str(host.dashboards)
    assert sorted(p.name for p in host.dashboards.iterdir()) == sorted(
        p.name for p in (REPO / "deploy/grafana/dashboards").glob("*.json"))
    assert sorted(p.name for p in host.systemd.iterdir()) == [
        "slurm-gpu-proxy.service", "slurm-gpu-report-archive.service",
        "slurm-gpu-report-archive.timer"]


def test_promtool_and_amtool_accept_what_it_wrote(host: MonitoringHost) -> None:
    prom = subprocess.run(["promtool", "check", "config", str(host.prom_config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert prom.returncode == 0, prom.stdout + prom.stderr
    for name in RULES:  # every installed rules file was found through the config's glob
        assert str(host.prom_dir / "rules" / name) in prom.stdout + prom.stderr
    am = subprocess.run(["amtool", "check-config", str(host.am_config)],
                        capture_output=True, text=True, timeout=60, check=False)
    assert am.returncode == 0, am.stdout + am.stderr


def _shipped_rules() -> set[tuple[str, str]]:
    """(group, alert or record name) of every rule in the shipped rules files."""
    return {(group["name"], rule.get("alert") or rule["record"])
            for name in RULES
            for group in yaml.safe_load((REPO / "deploy/prometheus/rules" / name).read_text())[
                "groups"]
            for rule in group["rules"]}


def test_prometheus_on_the_written_config_scrapes_an_agent_and_loads_every_rule(
        tmp_path: Path) -> None:
    """A real Prometheus on exactly what the role wrote, its one GPU node a simulated agent."""
    agent = Agent(["--simulate", "--sample-interval", "1"], log_path=tmp_path / "agent.log")
    prom = None
    try:
        site = MonitoringHost(tmp_path / "site", gpu_nodes={"sim-node": {
            "ansible_host": "127.0.0.1"}})
        rc, out, _ = site.play(slurm_gpu_monitoring_exporter_port=agent.port,
                               slurm_gpu_monitoring_scrape_interval="1s",
                               slurm_gpu_monitoring_alertmanager_targets=[])
        assert rc == 0, out[-4000:]
        agent.wait_ready()
        prom = Prometheus("monitoring", site.prom_config, tmp_path / "prometheus")
        prom.wait_ready()
        # The node's series, with the cluster label from the generated targets file.
        jobs = prom.wait_for('slurm_job_gpu_allocated_seconds_total{cluster="testcluster",'
                             f'instance="127.0.0.1:{agent.port}"}}', timeout=30)
        assert {s["metric"]["job"] for s in jobs} == {"slurm-gpu-exporter"}

        def rules_evaluated() -> list[dict] | None:
            groups = http_json(prom.url + "/api/v1/rules")["data"]["groups"]
            rules = [dict(r, group=g["name"]) for g in groups for r in g["rules"]]
            done = all(r["lastEvaluation"] > "2000" for r in rules)
            return rules if rules and done else None

        rules = wait_until(rules_evaluated, 30, "every rule group evaluated once", poll=0.5)
        assert {(r["group"], r["name"]) for r in rules} == _shipped_rules()
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
        recorded = [r["name"] for r in rules if r["type"] == "recording"]
        assert prom.wait_for(recorded[0], timeout=30), recorded[0]
    finally:
        if prom is not None:
            prom.stop()
        agent.stop()


def test_second_run_changes_nothing(host: MonitoringHost) -> None:
    rc, out, recap = host.play()
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


def test_check_mode_after_it_changes_nothing(host: MonitoringHost) -> None:
    rc, out, recap = host.play("--check", "--diff")
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


def test_a_broken_rules_file_is_refused_before_it_is_installed(host: MonitoringHost) -> None:
    files = host.base / "deploy-copy"
    shutil.copytree(REPO / "deploy", files, ignore=shutil.ignore_patterns("ansible"))
    (files / "prometheus" / "rules" / "training.rules.yml").write_text("groups: [{rules: 1}]\n")
    before = (host.prom_dir / "rules" / "training.rules.yml").read_bytes()
    rc, out, _ = host.play(slurm_gpu_monitoring_files_dir=str(files))
    assert rc != 0 and "failed to validate" in out
    assert (host.prom_dir / "rules" / "training.rules.yml").read_bytes() == before


def test_switching_the_proxy_off_removes_its_unit(host: MonitoringHost) -> None:
    rc, out, recap = host.play(slurm_gpu_monitoring_proxy=False)
    assert rc == 0 and recap["changed"] == 1, out[-4000:]
    assert not (host.systemd / "slurm-gpu-proxy.service").exists()


REVIEW_UNITS = ("slurm-gpu-report-review.service", "slurm-gpu-report-review.timer")


def _review_vars(host: MonitoringHost, **changed: object) -> dict[str, object]:
    return {"slurm_gpu_monitoring_review_to": ["gpu-admins@example.org", "ops@example.org"],
            "slurm_gpu_monitoring_review_out_dir": str(host.base / "srv" / "reviews"),
            "slurm_gpu_monitoring_review_calendar": "Fri *-*-* 16:30",
            "slurm_gpu_monitoring_review_threshold": 0.2,
            "slurm_gpu_monitoring_review_smtp": "smtp://mail.example.org:587",
            "slurm_gpu_monitoring_review_args": ["--prometheus-url", "http://prom:9090"],
            **changed}


def _env_words(path: Path) -> list[str]:
    """The words systemd makes of the review's flags (one double-quoted assignment)."""
    (line,) = [x for x in path.read_text().splitlines() if x and not x.startswith("#")]
    name, _, value = line.partition("=")
    assert name == "SLURM_GPU_REPORT_REVIEW_ARGS" and value[0] == value[-1] == '"', line
    return value[1:-1].split()


def test_recipients_switch_the_weekly_review_on_and_systemd_accepts_its_units(
        host: MonitoringHost) -> None:
    rc, out, recap = host.play(**_review_vars(host))
    assert rc == 0 and recap["changed"] > 0, out[-4000:]
    for unit in REVIEW_UNITS:
        assert (host.systemd / unit).read_bytes() == (REPO / "deploy/systemd" / unit).read_bytes()
    out_dir = host.base / "srv" / "reviews"
    words = _env_words(host.review_env)
    assert words == ["--since", "7d", "--threshold", "0.2",
                     "--report-to", "gpu-admins@example.org,ops@example.org",
                     "--smtp", "smtp://mail.example.org:587", "--mail-from", "slurm-gpu-report",
                     "--out-dir", str(out_dir), "--prometheus-url", "http://prom:9090"]
    # What the service runs parses as the review the role was asked for.
    from slurm_gpu_exporter.report.cli.flags import build_parser
    from slurm_gpu_exporter.report.cli.review import review_plan

    plan = review_plan(build_parser().parse_args(["low-util", "--since", "7d", *words]))
    assert plan is not None and plan.recipients == ("gpu-admins@example.org", "ops@example.org")
    assert plan.server == ("mail.example.org", 587) and plan.out_dir == out_dir
    schedule = host.systemd / "slurm-gpu-report-review.timer.d" / "schedule.conf"
    assert "\nOnCalendar=\nOnCalendar=Fri *-*-* 16:30\n" in schedule.read_text()
    drop_in = host.systemd / "slurm-gpu-report-review.service.d" / "out-dir.conf"
    assert f"\nReadWritePaths={out_dir}\n" in drop_in.read_text()
    assert oct(out_dir.stat().st_mode & 0o7777) == oct(0o2750)
    require(shutil.which("systemd-analyze") is not None, "systemd-analyze (Debian's systemd)")
    verify = subprocess.run(["systemd-analyze", "verify",
                             *(str(host.systemd / u) for u in REVIEW_UNITS)],
                            capture_output=True, text=True, timeout=60, check=False)
    problems = [line for line in verify.stderr.splitlines()
                if "slurm-gpu-" in line and "Command /opt/" not in line]
    assert not problems, verify.stderr
    rc, out, recap = host.play(**_review_vars(host))
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


@pytest.mark.parametrize(("changed", "said"), [
    ({"slurm_gpu_monitoring_review_to": ["Admins <a@example.org>"]},
     "give a list of plain addresses"),
    ({"slurm_gpu_monitoring_review_args": ["--cluster", "west east"]},
     "cannot be passed through systemd"),
    ({"slurm_gpu_monitoring_review_out_dir": "reviews"}, "give an absolute path"),
    ({"slurm_gpu_monitoring_review_calendar": "Mon\nExecStart=/bin/sh"},
     "cannot be passed through systemd"),
    ({"slurm_gpu_monitoring_review_calendar": "every full moon"},
     "is not a systemd calendar event"),
])
def test_a_review_setting_systemd_cannot_carry_is_refused_first(
        host: MonitoringHost, changed: dict[str, object], said: str) -> None:
    before = host.review_env.read_bytes()
    rc, out, _ = host.play(**_review_vars(host, **changed))
    assert rc != 0 and said in out, out[-4000:]
    assert host.review_env.read_bytes() == before


def test_no_recipients_and_no_directory_switch_the_review_off(host: MonitoringHost) -> None:
    rc, out, _ = host.play()
    assert rc == 0, out[-4000:]
    for path in (*(host.systemd / u for u in REVIEW_UNITS), host.review_env,
                 host.systemd / "slurm-gpu-report-review.timer.d",
                 host.systemd / "slurm-gpu-report-review.service.d"):
        assert not path.exists(), path
    assert (host.base / "srv" / "reviews").is_dir()  # the reviews written are the site's


ARCHIVE_UNITS = ("slurm-gpu-report-archive.service", "slurm-gpu-report-archive.timer")


def test_a_tracking_server_adds_the_mlflow_step_to_the_archive_run(host: MonitoringHost) -> None:
    rc, out, recap = host.play(
        slurm_gpu_monitoring_archive_mlflow_uri="https://mlflow.example.org:5000",
        slurm_gpu_monitoring_archive_mlflow_args=["--cluster", "west"])
    assert rc == 0 and recap["changed"] > 0, out[-4000:]
    drop_in = host.systemd / "slurm-gpu-report-archive.service.d" / "mlflow.conf"
    (line,) = [x for x in drop_in.read_text().splitlines() if x.startswith("ExecStart=")]
    command, *words, site_args = line.removeprefix("ExecStart=").split()
    assert command == "/opt/slurm-gpu-exporter/bin/slurm-gpu-report"
    assert site_args == "$SLURM_GPU_REPORT_MLFLOW_ARGS"
    from slurm_gpu_exporter.report.cli.flags import build_parser

    args = build_parser().parse_args(words)
    assert (args.command, args.since, args.tracking_uri, args.cluster) == (
        "mlflow", "2h", "https://mlflow.example.org:5000", "west")
    require(shutil.which("systemd-analyze") is not None, "systemd-analyze (Debian's systemd)")
    verify = subprocess.run(["systemd-analyze", "verify",
                             *(str(host.systemd / u) for u in ARCHIVE_UNITS)],
                            capture_output=True, text=True, timeout=60, check=False)
    problems = [line for line in verify.stderr.splitlines()
                if "slurm-gpu-" in line and "Command /opt/" not in line]
    assert not problems, verify.stderr
    rc, out, recap = host.play(
        slurm_gpu_monitoring_archive_mlflow_uri="https://mlflow.example.org:5000",
        slurm_gpu_monitoring_archive_mlflow_args=["--cluster", "west"])
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


@pytest.mark.parametrize(("uri", "args"), [
    ("mlflow.example.org", []),
    ("https://mlflow.example.org/%h", []),
    ("https://mlflow.example.org", ["--cluster", "west east"]),
])
def test_an_mlflow_setting_systemd_cannot_carry_is_refused(
        host: MonitoringHost, uri: str, args: list[str]) -> None:
    rc, out, _ = host.play(slurm_gpu_monitoring_archive_mlflow_uri=uri,
                           slurm_gpu_monitoring_archive_mlflow_args=args)
    assert rc != 0 and "cannot be passed through systemd" in out, out[-4000:]


def test_no_tracking_server_removes_the_mlflow_step(host: MonitoringHost) -> None:
    rc, out, _ = host.play()
    assert rc == 0, out[-4000:]
    assert not (host.systemd / "slurm-gpu-report-archive.service.d" / "mlflow.conf").exists()
    assert (host.systemd / "slurm-gpu-report-archive.service").exists()


def test_state_absent_removes_everything_it_wrote(host: MonitoringHost) -> None:
    rc, out, _ = host.play(slurm_gpu_monitoring_state="absent")
    assert rc == 0, out[-4000:]
    assert host.written() == []
    rc, out, recap = host.play(slurm_gpu_monitoring_state="absent")
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


# What the role writes with its default paths on a Debian monitoring host.
DEFAULT_PATHS = tuple(Path(p) for p in (
    "/etc/prometheus/prometheus.yml", "/etc/prometheus/slurm-gpu-exporter",
    "/etc/prometheus/alertmanager.yml",
    "/etc/grafana/provisioning/datasources/slurm-gpu-exporter.yml",
    "/etc/grafana/provisioning/dashboards/slurm-gpu-exporter.yml",
    "/var/lib/grafana/dashboards/slurm-gpu-exporter",
    "/etc/systemd/system/slurm-gpu-report-archive.service",
    "/etc/systemd/system/slurm-gpu-report-archive.timer"))
PREFIX = Path("/opt/slurm-gpu-exporter")


def _first_missing(path: Path) -> Path | None:
    """The outermost directory above path that does not exist yet (the role makes it)."""
    missing = None
    for parent in path.parents:
        if parent.exists():
            break
        missing = parent
    return missing


def test_applied_with_its_default_paths_on_this_machine(tmp_path: Path,
                                                        etc_lock: None) -> None:
    """The role on the real /etc/prometheus, /etc/grafana, /etc/systemd: what Debian's
    packages left there is put back afterwards, and what the role made is removed."""
    require(os.geteuid() == 0, "the role writes /etc/prometheus and /etc/systemd (needs root)")
    require(Path("/etc/prometheus").is_dir(), "Debian's prometheus is not installed")
    made = {d for d in map(_first_missing, DEFAULT_PATHS) if d is not None}
    saved = {path: move_aside(path) for path in (*DEFAULT_PATHS, PREFIX)}
    site = MonitoringHost(tmp_path)
    for key in [k for k in site.vars if k.endswith(("_config", "_dir", "_install"))]:
        del site.vars[key]  # the role's defaults
    try:
        rc, out, recap = site.play()
        assert rc == 0 and recap["changed"] > 0, out[-4000:]
        for path in DEFAULT_PATHS:
            assert path.exists(), path
        # The report and the proxy the units run, with the archive's libraries.
        for tool in ("slurm-gpu-report", "slurm-gpu-proxy"):
            run = subprocess.run([str(PREFIX / "bin" / tool), "--help"], capture_output=True,
                                 text=True, timeout=60, check=False)
            assert run.returncode == 0, run.stdout + run.stderr
        run = subprocess.run([str(PREFIX / "bin" / "python"), "-c", "import sqlalchemy, psycopg"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
        run = subprocess.run([str(PREFIX / "bin" / "slurm-gpu-report"), "usage", "--by", "user",
                              "--db", f"sqlite:///{tmp_path / 'none.sqlite'}"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 7 and "no archive at" in run.stderr, run.stderr  # it loaded
        prom = subprocess.run(["promtool", "check", "config", "/etc/prometheus/prometheus.yml"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert prom.returncode == 0, prom.stdout + prom.stderr
        am = subprocess.run(["amtool", "check-config", "/etc/prometheus/alertmanager.yml"],
                            capture_output=True, text=True, timeout=60, check=False)
        assert am.returncode == 0, am.stdout + am.stderr
        rc, out, recap = site.play()
        assert rc == 0 and recap["changed"] == 0, out[-4000:]
        rc, out, _ = site.play(slurm_gpu_monitoring_state="absent")
        assert rc == 0, out[-4000:]
        assert [str(p) for p in DEFAULT_PATHS if p.exists()] == []
        assert (PREFIX / "bin" / "slurm-gpu-report").exists()  # kept: an agent may share it
    finally:
        for path, sibling in saved.items():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            if sibling is not None:
                os.rename(sibling, path)
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)
