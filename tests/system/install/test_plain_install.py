"""What a user installs: the wheel, with no extras and with each extra, in a fresh venv.

The development venv has every extra and the test tools, so it cannot show what a plain
``pip install slurm-gpu-exporter`` gives. Here the wheel is built from a clean copy of
the checkout and installed into venvs made from the system Python (no test tools in
them); every console script and the commands a user starts with run from there: the
agent on a simulated node scraped by a real Prometheus, the reports against that
Prometheus, the proxy, ``check``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, free_port, require, wait_until
from tests.support.daemons import Prometheus, tool

pytestmark = [pytest.mark.process, pytest.mark.prometheus]

SYSTEM_PYTHON = Path("/usr/bin/python3")
# The console scripts the docs promise (DESIGN.md's contracts); the wheel may add more.
PROMISED_SCRIPTS = {"slurm-gpu-exporter", "slurm-gpu-exporter-prolog",
                    "slurm-gpu-exporter-epilog", "slurm-gpu-report", "slurm-gpu-proxy",
                    "slurm-gpu-mail"}
REPORT_COMMANDS = ("job", "low-util", "top", "archive", "usage", "default-config", "enforce",
                   "default-policy", "remediate")
EXTRAS = ("", "archive", "bench")
ARCHIVE_MESSAGE = "needs the job archive's libraries"


def _run(argv: list[str | Path], timeout: float = 120,
         check: bool = False) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                         timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    if check:
        assert run.returncode == 0, f"{argv}: {run.stdout[-2000:]}{run.stderr[-3000:]}"
    return run


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, not ignored): no .venv,
    no build leftovers, so the wheel holds what a release would."""
    listed = _run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                   "--exclude-standard"], check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(shutil.which("git") is not None, "git is not installed")
    base = tmp_path_factory.mktemp("wheel")
    source = _source_copy(base / "src")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
          "--disable-pip-version-check", "--wheel-dir", base / "dist", source],
         timeout=300, check=True)
    (built,) = (base / "dist").glob("slurm_gpu_exporter-*.whl")
    return built


class Install:
    """A venv from the system Python with the wheel (and one extra) installed."""

    def __init__(self, prefix: Path, wheel: Path, extra: str) -> None:
        self.prefix = prefix
        self.extra = extra
        _run([SYSTEM_PYTHON, "-m", "venv", prefix], check=True)
        target = f"{wheel}[{extra}]" if extra else str(wheel)
        _run([prefix / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check",
              target], timeout=600, check=True)

    def bin(self, name: str) -> Path:
        return self.prefix / "bin" / name

    def imports(self, module: str) -> bool:
        return _run([self.bin("python"), "-c", f"import {module}"]).returncode == 0


@pytest.fixture(scope="module")
def installs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    require(SYSTEM_PYTHON.exists() and _run([SYSTEM_PYTHON, "-c", "import ensurepip"])
            .returncode == 0, "the system Python with venv (Debian's python3-venv)")
    made: dict[str, Install] = {}

    def get(extra: str) -> Install:
        if extra not in made:
            made[extra] = Install(tmp_path_factory.mktemp(f"venv-{extra or 'plain'}"),
                                  wheel, extra)
        return made[extra]

    yield get  # type: ignore[misc]


def _scripts_in(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(name).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    return {line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line}


def test_the_wheel_installs_every_promised_console_script(wheel: Path) -> None:
    assert _scripts_in(wheel) >= PROMISED_SCRIPTS


def test_a_plain_install_has_neither_the_archive_nor_the_test_tools(installs) -> None:
    plain = installs("")
    for module in ("sqlalchemy", "psycopg", "pytest", "ansible"):
        assert not plain.imports(module), f"{module} came with a plain install"
    assert installs("archive").imports("sqlalchemy")
    assert installs("archive").imports("psycopg")


@pytest.mark.parametrize("extra", EXTRAS, ids=lambda e: e or "no-extra")
def test_every_console_script_prints_its_help(installs, wheel: Path, extra: str) -> None:
    install = installs(extra)
    for script in sorted(_scripts_in(wheel)):
        run = _run([install.bin(script), "--help"], timeout=60)
        assert run.returncode == 0 and "usage" in run.stdout.lower(), (
            f"{script} --help with [{extra}]: {run.stdout[-1000:]}{run.stderr[-3000:]}")
        assert "Traceback" not in run.stderr, run.stderr
    report_help = _run([install.bin("slurm-gpu-report"), "--help"], check=True).stdout
    for command in REPORT_COMMANDS:
        assert command in report_help, f"slurm-gpu-report --help does not list {command}"
    for command in REPORT_COMMANDS:
        _run([install.bin("slurm-gpu-report"), command, "--help"], check=True)


def test_bench_extra_brings_its_profiler(installs) -> None:
    _run([installs("bench").bin("py-spy"), "--version"], check=True)


def test_the_shipped_hooks_run_the_installed_entry_points_without_site(
        installs, tmp_path: Path) -> None:
    """prolog/ and epilog/slurm-gpu-exporter.sh start the venv's interpreter with -I -S
    and find the package in its site-packages by hand: a .pth file there, which site
    would run, is not run, and the job is recorded and marked ended."""
    install = installs("")
    (site_packages,) = install.prefix.glob("lib/python3*/site-packages")
    marker = tmp_path / "site-ran"
    pth = site_packages / "zz-test-site-marker.pth"
    pth.write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    try:
        defaults = tmp_path / "defaults"
        defaults.write_text(f"SLURM_GPU_EXPORTER_PREFIX={install.prefix}\n")
        env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice",
               "SLURM_GPU_EXPORTER_SPOOL_DIR": str(tmp_path / "spool")}
        for kind in ("prolog", "epilog"):
            script = tmp_path / f"{kind}.sh"
            text = (REPO / kind / "slurm-gpu-exporter.sh").read_text()
            script.write_text(text.replace("/etc/default/slurm-gpu-exporter", str(defaults)))
            run = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True,
                                 text=True, timeout=30, check=False)
            assert run.returncode == 0 and run.stderr == "", run.stderr
        data = json.loads((tmp_path / "spool" / "77.json").read_text())
        assert data["user"] == "alice" and data["start_time"] and data["end_time"]
        assert not marker.exists(), "the hooks ran site"
    finally:
        pth.unlink()


@pytest.mark.parametrize("extra", ("", "bench"), ids=lambda e: e or "no-extra")
def test_archive_commands_without_the_archive_say_which_extra_to_install(
        installs, tmp_path: Path, extra: str) -> None:
    install = installs(extra)
    db = f"sqlite:///{tmp_path / 'archive.sqlite'}"
    dead = f"http://127.0.0.1:{free_port()}"
    for argv in (["usage", "--by", "user", "--db", db],
                 ["archive", "--db", db, "--prometheus-url", dead, "--no-sacct"],
                 ["job", "123", "--db", db, "--prometheus-url", dead, "--no-sacct"],
                 ["low-util", "--db", db, "--prometheus-url", dead]):
        run = _run([install.bin("slurm-gpu-report"), *argv])
        assert run.returncode == 2, (argv, run.stdout, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and ARCHIVE_MESSAGE in lines[0], (argv, run.stderr)
        assert f"{install.prefix}/bin/pip install 'slurm-gpu-exporter[archive]'" in lines[0]
    # the proxy runs without the archive; its --archive.url says the same at start
    run = _run([install.bin("slurm-gpu-proxy"), "--prometheus-url", dead, "--archive.url", db])
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and ARCHIVE_MESSAGE in lines[0], run.stderr
    assert f"{install.prefix}/bin/pip install 'slurm-gpu-exporter[archive]'" in lines[0]


@pytest.fixture(scope="module")
def simulated(installs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """The plain install's agent on a simulated node, scraped every second by a real
    Prometheus."""
    plain = installs("")
    workdir = tmp_path_factory.mktemp("simulated")
    port = free_port()
    log = (workdir / "agent.log").open("wb")
    agent = subprocess.Popen([plain.bin("slurm-gpu-exporter"), "--simulate",
                              "--sample-interval", "1",
                              "--web.listen-address", f"127.0.0.1:{port}"],
                             stdout=log, stderr=subprocess.STDOUT)
    prom = None
    try:
        prom = Prometheus("prometheus", {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "slurm-gpu-exporter",
                                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }, workdir / "prometheus")
        prom.wait_ready()
        yield port, prom, workdir / "agent.log"
    finally:
        if prom is not None:
            prom.stop()
        agent.send_signal(signal.SIGTERM)
        try:
            assert agent.wait(15) == 0, (workdir / "agent.log").read_text()[-3000:]
        finally:
            if agent.poll() is None:
                agent.kill()
            log.close()


def test_the_plain_install_agent_serves_a_simulated_node(simulated) -> None:
    port, _prom, log = simulated

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body = r.read().decode()
        except OSError:
            return None
        return body if "slurm_job_gpu_busy_seconds_total{" in body else None

    body = wait_until(scrape, 60, "a scrape with per-job GPU series", poll=0.5,
                      log=lambda: log.read_text()[-3000:])
    assert "slurm_gpu_exporter_build_info" in body


def test_the_plain_install_reports_from_a_real_prometheus(installs, simulated) -> None:
    plain = installs("")
    _port, prom, _log = simulated
    jobs = prom.wait_for('slurm_job_gpu_busy_seconds_total > 0', timeout=90)
    jobid = jobs[0]["metric"]["jobid"]
    # A range of samples for the job's rates and ratios.
    prom.wait_for(f'count_over_time(slurm_job_gpus{{jobid="{jobid}"}}[1m]) >= 5',
                  timeout=60)
    report = _run([plain.bin("slurm-gpu-report"), "low-util", "--prometheus-url", prom.url,
                   "--since", "5m", "--threshold", "1", "--format", "json"], check=True)
    flagged = json.loads(report.stdout)
    assert flagged, report.stdout
    job = _run([plain.bin("slurm-gpu-report"), "job", jobid, "--prometheus-url", prom.url,
                "--since", "5m", "--no-sacct", "--format", "json"], check=True)
    assert jobid in job.stdout and "Traceback" not in job.stderr


# One ended job, backfilled: alice's, 2 GPUs held for an hour, busy 30 and 15 minutes.
ENDED_JOB_S = 3600
ENDED_BUSY_S = (1800, 900)


def _ended_job_openmetrics(start: int) -> str:
    """The series an agent leaves of that job, every 15 s over its hour and 10 minutes
    after its end (the counters then stay at their totals)."""
    job = 'jobid="7001",user="alice",account="physics",instance="gpu01:9817"'
    rows: dict[str, list[str]] = {}
    for t in range(start, start + ENDED_JOB_S + 601, 15):
        held = min(t - start, ENDED_JOB_S)
        rows.setdefault("info", []).append(f"slurm_job_info{{{job}}} 1 {t}")
        rows.setdefault("start", []).append(
            f"slurm_job_start_time_seconds{{{job}}} {start} {t}")
        if t >= start + ENDED_JOB_S:
            rows.setdefault("end", []).append(
                f"slurm_job_end_time_seconds{{{job}}} {start + ENDED_JOB_S} {t}")
        for gpu, busy in enumerate(ENDED_BUSY_S):
            labels = f'{job},gpu="{gpu}",uuid="GPU-{gpu}"'
            rows.setdefault("alloc", []).append(
                f"slurm_job_gpu_allocated_seconds_total{{{labels}}} {held} {t}")
            rows.setdefault("busy", []).append(
                f"slurm_job_gpu_busy_seconds_total{{{labels}}} {held * busy / ENDED_JOB_S} {t}")
    families = [("info", "slurm_job_info", "gauge"),
                ("start", "slurm_job_start_time_seconds", "gauge"),
                ("end", "slurm_job_end_time_seconds", "gauge"),
                ("alloc", "slurm_job_gpu_allocated_seconds", "counter"),
                ("busy", "slurm_job_gpu_busy_seconds", "counter")]
    lines = []
    for key, family, kind in families:
        lines += [f"# TYPE {family} {kind}", *rows[key]]
    return "\n".join(lines) + "\n# EOF\n"


def test_the_archive_extra_archives_and_reads_back(installs, tmp_path: Path) -> None:
    """An ended job whose figures the test knows (backfilled into a real Prometheus) is
    archived by the archive extra, and ``usage`` reads back exactly those figures."""
    archive = installs("archive")
    start = (int(time.time()) - 3 * 3600) // 60 * 60
    source = tmp_path / "backfill.om"
    source.write_text(_ended_job_openmetrics(start))
    subprocess.run([tool("promtool", package="prometheus"), "tsdb", "create-blocks-from",
                    "openmetrics", str(source), str(tmp_path / "prom" / "data")],
                   check=True, capture_output=True, timeout=120)
    prom = Prometheus("prometheus", {"global": {"scrape_interval": "15s"},
                                     "scrape_configs": []}, tmp_path / "prom",
                      extra_args=("--storage.tsdb.retention.time=30d",))
    try:
        prom.wait_ready()
        prom.wait_for('slurm_job_info{jobid="7001"}[4h]', timeout=60)
        db = f"sqlite:///{tmp_path / 'archive.sqlite'}"
        stored = _run([archive.bin("slurm-gpu-report"), "archive", "--db", db,
                       "--prometheus-url", prom.url, "--start", str(start - 600),
                       "--end", str(start + ENDED_JOB_S + 600), "--no-sacct"], check=True)
    finally:
        prom.stop()
    assert stored.stdout.startswith("archived 1 jobs "), stored.stdout
    usage = _run([archive.bin("slurm-gpu-report"), "usage", "--by", "user", "--db", db,
                  "--since", "1d", "--format", "json"], check=True)
    shown = json.loads(usage.stdout)
    assert shown["by"] == ["user"], shown
    (group,) = shown["groups"]
    held_h, busy_h = 2 * ENDED_JOB_S / 3600, sum(ENDED_BUSY_S) / 3600  # 2.0 and 0.75
    assert (group["user"], group["jobs"]) == ("alice", 1), group
    assert group["gpu_hours"] == pytest.approx(held_h, rel=1e-3), group
    assert group["busy_gpu_hours"] == pytest.approx(busy_h, rel=1e-3), group
    assert group["wasted_gpu_hours"] == pytest.approx(held_h - busy_h, rel=1e-3), group
    assert group["busy_ratio"] == pytest.approx(busy_h / held_h, rel=1e-3), group


def test_check_on_a_plain_install_answers_in_json(installs) -> None:
    """docs/check.md's contract: ``{"exit_code": 0|1, "findings": [...]}``, the exit
    status the same as ``exit_code``, 1 exactly when a finding is BLOCK."""
    run = _run([installs("").bin("slurm-gpu-exporter"), "check", "--format", "json"],
               timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    shown = json.loads(run.stdout)
    findings = shown["findings"]
    assert findings and all(set(f) == {"severity", "area", "message"} for f in findings)
    assert {f["severity"] for f in findings} <= {"ok", "note", "warn", "block"}, findings
    blocked = any(f["severity"] == "block" for f in findings)
    assert shown["exit_code"] == run.returncode == (1 if blocked else 0), (run.returncode,
                                                                            findings)
    # what it looks at, whatever this machine has
    assert {"spool", "state"} <= {f["area"] for f in findings}, findings


def test_gpu_check_installs_offline_from_the_wheels_its_docs_make(tmp_path: Path) -> None:
    """docs/gpu-check.md's offline path, as written: the wheels downloaded for the
    machine's python3, then ``scripts/gpu-check --wheels DIR`` in a checkout with no
    .venv, which must install from DIR alone (``--no-index``)."""
    python3 = shutil.which("python3")
    require(python3 is not None and shutil.which("git") is not None, "python3 and git")
    assert python3 is not None
    machine = _run(["uname", "-m"], check=True).stdout.strip()
    version = _run([python3, "-c", "import sys; print(f'{sys.version_info[0]}."
                    "{sys.version_info[1]}')"], check=True).stdout.strip()
    checkout = _source_copy(tmp_path / "checkout")
    deps = tmp_path / "deps.txt"
    deps.write_text("\n".join(_dependencies()) + "\n")
    wheels = tmp_path / "gpu-check-wheels"
    _run([python3, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
          "--only-binary=:all:", "--python-version", version,
          "--platform", f"manylinux2014_{machine}", "--platform", f"manylinux_2_17_{machine}",
          "--platform", f"manylinux_2_28_{machine}", "-d", wheels, "-r", deps],
         timeout=300, check=True)
    run = _run([checkout / "scripts" / "gpu-check", "--wheels", wheels, "--help"], timeout=300)
    assert run.returncode == 0 and "usage" in run.stdout, run.stdout + run.stderr
    venv_python = checkout / ".venv" / "bin" / "python"
    for module in ("pynvml", "prometheus_client", "aiohttp", "bcrypt", "yaml", "rich",
                   "promql_parser"):
        assert _run([venv_python, "-c", f"import {module}"]).returncode == 0, module


def _dependencies() -> list[str]:
    """The runtime dependencies, as the docs' one-liner reads them from pyproject.toml."""
    with (REPO / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])
