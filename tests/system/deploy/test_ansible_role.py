"""The Ansible role, applied for real to this machine with ``connection: local``.

The role writes the real /opt/slurm-gpu-exporter, /etc/default/slurm-gpu-exporter and
/etc/systemd/system paths (the product fixes them); the module moves whatever was there
aside first and puts it back at the end, so the machine is left as found. Everything the
role lets a site choose (spool, state, prolog.d, slurm.conf, listen address) points into a
temporary directory. The tests here hold the lock on /etc (tests/system/deploy/conftest.py); the
test cluster itself never writes /etc/default/slurm-gpu-exporter.

The tests of this module build on each other in file order (fresh node, install, second
run, check mode, the installed agent, conflicts, removal, the wheel method).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from slurm_gpu_exporter.report.cli.client_config import ClientConfig, load_client_config
from tests.support import REPO, free_port, move_aside, require, wait_until

pytestmark = pytest.mark.process


@pytest.fixture(autouse=True)
def _node_wide(etc_lock: None) -> None:
    """Every test here writes /opt and /etc, or reads what another wrote: one at a time."""

ANSIBLE_DIR = REPO / "deploy" / "ansible"
SHIPPED_UNIT = REPO / "deploy" / "systemd" / "slurm-gpu-exporter.service"
VENV_BIN = Path(sys.executable).parent

PREFIX = Path("/opt/slurm-gpu-exporter")
DEFAULTS_FILE = Path("/etc/default/slurm-gpu-exporter")
UNIT = Path("/etc/systemd/system/slurm-gpu-exporter.service")
DROPIN_DIR = Path("/etc/systemd/system/slurm-gpu-exporter.service.d")
WANTS_LINK = Path("/etc/systemd/system/multi-user.target.wants/slurm-gpu-exporter.service")
CONFIG_DIR = Path("/etc/slurm-gpu-exporter")
TMPFILES = Path("/etc/tmpfiles.d/slurm-gpu-exporter.conf")
# Every fixed path the role may write: saved before the module, restored after it.
GLOBAL_PATHS = (PREFIX, DEFAULTS_FILE, UNIT, DROPIN_DIR, WANTS_LINK, CONFIG_DIR, TMPFILES)

PASSWORD = "scrape-secret"
JOBID = "424242"


@dataclass
class PlayResult:
    rc: int
    output: str

    @property
    def recap(self) -> dict[str, int]:
        """The PLAY RECAP counters of the single host."""
        match = re.search(r"^localhost\s*:\s*(.*)$", self.output, re.MULTILINE)
        assert match, f"no PLAY RECAP in the output:\n{self.output[-3000:]}"
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


class Node:
    """This machine as an Ansible target, with the site's choices under ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.spool = base / "spool"
        self.state = base / "state"
        self.prolog_d = base / "prolog.d"
        self.epilog_d = base / "epilog.d"
        self.hook_dir = base / "libexec"
        self.slurm_conf = base / "slurm.conf"
        self.client_config = base / "slurm-gpu-report" / "client.toml"
        # A controller nobody listens for: the reconfigure handler must find it silent.
        self.slurm_conf.write_text(
            "ClusterName=roletest\n"
            f"SlurmctldHost=roletest-ctld(127.0.0.1)\nSlurmctldPort={free_port()}\n"
            "PrologFlags=X11\n"
        )
        self.inventory = base / "inventory.yml"
        self.inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {
            "localhost": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ansible_become": False,
            }}}}}}))
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        self.vars = {
            "slurm_gpu_exporter_install_method": "src",
            "slurm_gpu_exporter_src_dir": str(REPO),
            "slurm_gpu_exporter_local_cache_path": str(base / "wheel-cache"),
            "slurm_gpu_exporter_web_listen_address": [f"127.0.0.1:{self.port}"],
            "slurm_gpu_exporter_basic_auth_users": {"prometheus": hashed},
            "slurm_gpu_exporter_spool_dir": str(self.spool),
            "slurm_gpu_exporter_state_dir": str(self.state),
            "slurm_gpu_exporter_prolog_dir": str(self.prolog_d),
            "slurm_gpu_exporter_epilog_dir": str(self.epilog_d),
            "slurm_gpu_exporter_hook_dir": str(self.hook_dir),
            "slurm_gpu_exporter_slurm_conf": str(self.slurm_conf),
            "slurm_gpu_exporter_manage_slurm_conf": True,
            "slurm_gpu_exporter_sample_interval": 1,
            "slurm_gpu_exporter_extra_args": ["--slurm-lookup=off"],
            "slurm_gpu_exporter_client_proxy_url": "https://proxy.example.org:9818",
            "slurm_gpu_exporter_client_config": str(self.client_config),
        }
        self.runs = 0

    def play(self, *args: str, **overrides: object) -> PlayResult:
        """Run site.yml against this machine; ``overrides`` replace the default vars."""
        self.runs += 1
        varfile = self.base / f"vars-{self.runs}.json"
        varfile.write_text(json.dumps({**self.vars, **overrides}))
        env = {
            **os.environ,
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_HOME": str(self.base / "ansible-home"),
            "ANSIBLE_LOCAL_TEMP": str(self.base / "ansible-tmp"),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), "site.yml",
             "-e", f"@{varfile}", *args],
            cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300,
        )
        return PlayResult(proc.returncode, proc.stdout + proc.stderr)

    def hook(self, name: str) -> Path:
        return {"prolog": self.prolog_d, "epilog": self.epilog_d}[name] / "50-slurm-gpu-exporter.sh"

    def leftovers(self) -> list[str]:
        """What the role put on the node and still exists (the state dir is kept by design)."""
        candidates = [*GLOBAL_PATHS, self.spool, self.hook("prolog"), self.hook("epilog"),
                      self.hook_dir, self.client_config]
        return [str(p) for p in candidates if p.exists() or p.is_symlink()]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    require(os.geteuid() == 0, "the role writes /opt, /etc/default and /etc/systemd (needs root)")
    require((VENV_BIN / "ansible-playbook").exists(),
            "ansible-core is not installed (pip install -e '.[test]')")
    require(shutil.which("systemd-analyze") is not None and shutil.which("systemctl") is not None,
            "systemd's tools are missing (Debian: apt-get install systemd)")
    base = tmp_path_factory.mktemp("role-node")
    saved = {path: move_aside(path) for path in GLOBAL_PATHS}
    try:
        node = Node(base)
        # Before the module's first build, the wheel cache holds a wheel of older sources
        # and what other tools keep there.
        cache = base / "wheel-cache"
        (cache / "0123456789abcdef").mkdir(parents=True)
        (cache / "0123456789abcdef" / "slurm_gpu_exporter-0.0.1-py3-none-any.whl").write_bytes(
            b"")
        (cache / "fakenvml" / "fedcba9876543210").mkdir(parents=True)
        (cache / "fakenvml" / "fedcba9876543210" / "libnvidia-ml.so.1").write_bytes(b"")
        (cache / "notes").write_text("the site's\n")
        yield node
    finally:
        for path, sibling in saved.items():
            _remove(path)
            if sibling is not None:
                os.rename(sibling, path)


@pytest.fixture(scope="module")
def installed(node: Node) -> PlayResult:
    """The role applied once from the checkout; later tests reuse this install."""
    result = node.play()
    assert result.rc == 0, result.output[-4000:]
    return result


def _unit_command(unit_text: str, env: dict[str, str]) -> list[str]:
    """ExecStart= as systemd expands it: $VAR splits at whitespace, ${VAR} is one word."""
    line = next(x for x in unit_text.splitlines() if x.startswith("ExecStart="))
    argv: list[str] = []
    for word in shlex.split(line.removeprefix("ExecStart=")):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def _environment_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            env[key.strip()] = value.strip().strip('"')
    return env


def _get(url: str, auth: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, ConnectionError):
        return 0, ""  # not listening (yet)


# -- tests, in the order a site meets them --------------------------------------------------


def test_check_diff_on_a_fresh_node_writes_nothing(node: Node) -> None:
    conf_before = node.slurm_conf.read_text()
    result = node.play("--check", "--diff")
    assert result.rc == 0, result.output[-4000:]
    assert result.recap["changed"] > 0
    assert "+PrologFlags=X11,Alloc,Contain" in result.output  # the diff of slurm.conf
    assert node.leftovers() == []
    assert node.slurm_conf.read_text() == conf_before


def test_run_tag_alone_on_a_fresh_node_says_what_to_do(node: Node) -> None:
    result = node.play("--tags", "run")
    assert result.rc != 0
    assert "is not installed on localhost; run the role with the install and configure tags" \
        in result.output
    assert node.leftovers() == []


def test_the_wheel_cache_loses_only_the_wheels_of_older_sources(
        node: Node, installed: PlayResult) -> None:
    cache = node.base / "wheel-cache"
    built = [p for p in cache.iterdir() if re.fullmatch("[0-9a-f]{16}", p.name)]
    assert built and all(list(p.glob("slurm_gpu_exporter-*.whl")) for p in built), built
    assert not (cache / "0123456789abcdef").exists()
    # Other tools' files stay (the role took every other directory, a test library's
    # cache among them, while that library's tests ran).
    assert (cache / "fakenvml" / "fedcba9876543210" / "libnvidia-ml.so.1").is_file()
    assert (cache / "notes").read_text() == "the site's\n"


def test_install_from_the_checkout(node: Node, installed: PlayResult) -> None:
    assert installed.recap["changed"] > 0 and installed.recap["failed"] == 0
    version = subprocess.run([str(PREFIX / "bin" / "slurm-gpu-exporter"), "--version"],
                             capture_output=True, text=True, check=True)
    assert version.stdout.startswith("slurm-gpu-exporter ")
    # A GPU node gets no extras: every tool runs, the archive says which extra it needs.
    for tool in ("slurm-gpu-report", "slurm-gpu-proxy", "slurm-gpu-exporter-prolog"):
        helped = subprocess.run([str(PREFIX / "bin" / tool), "--help"], capture_output=True,
                                text=True, timeout=60, check=False)
        assert helped.returncode == 0, helped.stdout + helped.stderr
    usage = subprocess.run([str(PREFIX / "bin" / "slurm-gpu-report"), "usage", "--by", "user"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert usage.returncode == 2 and "slurm-gpu-exporter[archive]" in usage.stderr, (
        usage.stderr)
    # One source for the unit: the installed file is the shipped one, byte for byte.
    assert UNIT.read_bytes() == SHIPPED_UNIT.read_bytes()
    assert (DROPIN_DIR / "paths.conf").read_text().splitlines()[-1] == (
        f"ReadWritePaths={node.spool} {node.state}")
    assert f"d {node.spool} 0755 root root -" in TMPFILES.read_text()
    defaults = _environment_file(DEFAULTS_FILE)
    assert defaults["SLURM_GPU_EXPORTER_PREFIX"] == str(PREFIX)
    assert defaults["SLURM_GPU_EXPORTER_SPOOL_DIR"] == str(node.spool)
    assert defaults["SLURM_GPU_EXPORTER_ARGS"].split() == [
        f"--web.listen-address=127.0.0.1:{node.port}",
        f"--web.config.file={CONFIG_DIR}/web-config.yml",
        f"--spool-dir={node.spool}", f"--state-dir={node.state}",
        "--sample-interval=1", "--job-linger=120", "--log.level=info", "--slurm-lookup=off",
    ]
    modes = {p: (p.stat().st_mode & 0o7777, p.stat().st_uid) for p in [
        CONFIG_DIR / "web-config.yml", node.spool, node.state,
        node.hook("prolog"), node.hook("epilog"), UNIT, DEFAULTS_FILE]}
    assert modes == {
        CONFIG_DIR / "web-config.yml": (0o640, 0), node.spool: (0o755, 0),
        node.state: (0o755, 0), node.hook("prolog"): (0o755, 0),
        node.hook("epilog"): (0o755, 0), UNIT: (0o644, 0), DEFAULTS_FILE: (0o644, 0),
    }
    assert node.hook("prolog").read_bytes() == (REPO / "prolog/slurm-gpu-exporter.sh").read_bytes()
    # the users' slurm-gpu-report reads the client config the role wrote
    info = node.client_config.stat()
    assert (info.st_mode & 0o7777, info.st_uid) == (0o644, 0)
    assert load_client_config(node.client_config) == ClientConfig(
        prometheus_url="https://proxy.example.org:9818", auth="munge")
    conf = node.slurm_conf.read_text().splitlines()
    assert f"Prolog={node.prolog_d}/*" in conf
    assert f"Epilog={node.epilog_d}/*" in conf
    assert "PrologFlags=X11,Alloc,Contain" in conf
    # slurm.conf changed, but this controller does not answer: no reconfigure, and a word why.
    assert "slurmctld does not answer" in installed.output
    assert re.search(r"RUNNING HANDLER \[slurm_gpu_exporter : Run scontrol reconfigure\]"
                     r"[^\n]*\nskipping:", installed.output)
    if not Path("/run/systemd/system").is_dir():
        assert "installed and enabled but not started" in installed.output
        assert WANTS_LINK.resolve() == UNIT


def test_second_run_changes_nothing(node: Node, installed: PlayResult) -> None:
    result = node.play()
    assert result.rc == 0, result.output[-4000:]
    assert result.recap["changed"] == 0, result.output[-4000:]


def test_check_mode_on_the_installed_node_reports_no_change(node: Node,
                                                            installed: PlayResult) -> None:
    result = node.play("--check", "--diff")
    assert result.rc == 0, result.output[-4000:]
    assert result.recap["changed"] == 0, result.output[-4000:]


def test_installed_unit_passes_systemd_analyze(installed: PlayResult) -> None:
    verify = subprocess.run(["systemd-analyze", "verify", str(UNIT)],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The hardening set stays in force: systemd rates the unit's exposure at most 5 of 10.
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--threshold=50", str(UNIT)],
        capture_output=True, text=True)
    assert security.returncode == 0, security.stdout[-2000:]


def test_agent_from_the_installed_unit_exports_a_job_from_the_installed_prolog(
    node: Node, installed: PlayResult
) -> None:
    env = _environment_file(DEFAULTS_FILE)
    argv = _unit_command(UNIT.read_text(), env)
    assert argv[0] == str(PREFIX / "bin" / "slurm-gpu-exporter")
    agent_log = node.base / "agent.log"
    log = agent_log.open("w")
    agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             env={"PATH": "/usr/bin:/bin"})
    url = f"http://127.0.0.1:{node.port}"
    try:
        def ready() -> bool:
            assert agent.poll() is None, f"the agent exited: {agent_log.read_text()[-3000:]}"
            return _get(f"{url}/-/ready", f"prometheus:{PASSWORD}")[0] == 200

        wait_until(ready, 30, "the agent to be ready", poll=0.2)
        assert _get(f"{url}/metrics")[0] == 401  # the role's web config is in force
        # slurmd runs prologs as root with a bare environment.
        job_env = {"SLURM_JOB_ID": JOBID, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
                   "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "roletest"}
        subprocess.run([str(node.hook("prolog"))], env=job_env, check=True, timeout=10)
        assert (node.spool / f"{JOBID}.json").exists()
        body = wait_until(
            lambda: (lambda r: r[1] if f'jobid="{JOBID}"' in r[1] else "")(
                _get(f"{url}/metrics", f"prometheus:{PASSWORD}")),
            15, f"job {JOBID} in /metrics")
        assert re.search(rf'^slurm_job_info\{{[^}}]*jobid="{JOBID}"', body, re.MULTILINE)
        subprocess.run([str(node.hook("epilog"))], env=job_env, check=True, timeout=10)
        record = json.loads((node.spool / f"{JOBID}.json").read_text())
        assert record.get("end_time")
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()
    assert agent.returncode == 0, agent_log.read_text()[-3000:]


def test_conflicting_prolog_stops_the_role(node: Node, installed: PlayResult) -> None:
    conf = node.base / "site-slurm.conf"
    conf.write_text("ClusterName=site\nProlog=/etc/slurm/site-prolog.sh\n")
    result = node.play(slurm_gpu_exporter_slurm_conf=str(conf))
    assert result.rc != 0
    assert "already has Prolog=/etc/slurm/site-prolog.sh" in result.output
    assert "does not overwrite it" in result.output
    assert "slurm_gpu_exporter_manage_slurm_conf: false" in result.output
    assert conf.read_text() == "ClusterName=site\nProlog=/etc/slurm/site-prolog.sh\n"


def test_plain_password_is_refused(node: Node, installed: PlayResult) -> None:
    result = node.play(slurm_gpu_exporter_basic_auth_users={"prometheus": "hunter2"})
    assert result.rc != 0
    assert "is not a bcrypt hash" in result.output
    assert "hunter2" not in result.output


def test_wheel_switches_the_install_and_the_hooks(node: Node, installed: PlayResult,
                                                 tmp_path: Path) -> None:
    """An offline site: a wheel built from the checkout, scripts named in slurm.conf."""
    wheels = tmp_path / "wheels"
    # Another SOURCE_DATE_EPOCH than the role's: same version, different bytes, so the role
    # has to notice the new file and reinstall, not keep what pip calls "the same version".
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--wheel-dir", str(wheels), str(REPO)],
                   check=True, timeout=300, env={**os.environ, "SOURCE_DATE_EPOCH": "1000000000"})
    (wheel,) = wheels.glob("slurm_gpu_exporter-*.whl")
    result = node.play(slurm_gpu_exporter_install_method="wheel",
                       slurm_gpu_exporter_wheel=str(wheel),
                       slurm_gpu_exporter_slurm_hooks="slurm_conf")
    assert result.rc == 0, result.output[-4000:]
    assert re.search(r"TASK \[slurm_gpu_exporter : Reinstall the package from the wheel\][^\n]*"
                     r"\nchanged:", result.output), result.output[-4000:]
    assert (PREFIX / "dist" / wheel.name).read_bytes() == wheel.read_bytes()
    subprocess.run([str(PREFIX / "bin" / "slurm-gpu-exporter"), "--version"], check=True,
                   capture_output=True)
    lines = node.slurm_conf.read_text().splitlines()
    # The role's own earlier Prolog=/Epilog= lines are replaced, not reported as a conflict.
    assert f"Prolog={node.hook_dir}/prolog.sh" in lines
    assert f"Epilog={node.hook_dir}/epilog.sh" in lines
    assert os.access(node.hook_dir / "prolog.sh", os.X_OK)
    assert not node.hook("prolog").exists()  # slurmd must not run a second copy
    assert not node.hook("epilog").exists()
    node.vars.update(slurm_gpu_exporter_install_method="wheel",
                     slurm_gpu_exporter_wheel=str(wheel),
                     slurm_gpu_exporter_slurm_hooks="slurm_conf")


def test_absent_removes_only_what_it_installed_and_everything_but_the_state_dir(
        node: Node, installed: PlayResult) -> None:
    # The hook dir and the spool may be the site's own (a shared libexec dir, /run):
    # what the site keeps there stays, and only the role's and agent's files go.
    node.hook_dir.mkdir(parents=True, exist_ok=True)
    node.spool.mkdir(parents=True, exist_ok=True)
    site_files = [node.hook_dir / "site-prolog.sh", node.spool / "site-notes.txt",
                  node.spool / "README.json"]
    for path in site_files:
        path.write_text("the site's\n")
    (node.hook_dir / "prolog.sh").write_text("#!/bin/sh\n")  # the role's, as installed
    (node.spool / "4242.json").write_text("{}")  # a record the prolog wrote
    result = node.play(slurm_gpu_exporter_state="absent")
    assert result.rc == 0, result.output[-4000:]
    assert all(path.read_text() == "the site's\n" for path in site_files)
    assert not (node.hook_dir / "prolog.sh").exists()
    assert not (node.spool / "4242.json").exists()
    for path in site_files:
        path.unlink()
    result = node.play(slurm_gpu_exporter_state="absent")  # now they are empty: gone
    assert result.rc == 0, result.output[-4000:]
    assert node.leftovers() == []
    assert node.state.is_dir()
    conf = node.slurm_conf.read_text()
    assert "Prolog=" not in conf and "Epilog=" not in conf
    assert "PrologFlags=X11,Alloc,Contain" in conf


def test_ansible_lint_production_profile_is_clean() -> None:
    lint = VENV_BIN / "ansible-lint"
    require(lint.exists(), "ansible-lint is not installed (pip install -e '.[test]')")
    result = subprocess.run([str(lint), "--offline", "--profile", "production", "--nocolor"],
                            cwd=ANSIBLE_DIR, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
