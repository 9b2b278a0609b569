"""slurm-gpu-proxy refuses to start on settings that would leave it open or unusable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

PROXY = str(Path(sys.executable).parent / "slurm-gpu-proxy")


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --prometheus-url URL"),
    (["--prometheus-url", "http://127.0.0.1:9090"], "nobody could sign in"),
    (["--prometheus-url", "ftp://x"], "must start with http:// or https://"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--admin", "bad name"], "not a user name"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--munge.audience", "http://p:9818"],
     "--munge.audience needs --munge"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--munge", "--munge.audience", "ftp://p"],
     "--munge.audience: 'ftp://p' is not an http:// or https:// URL"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--limits.checks-per-user", "0"],
     "--limits.checks-per-user must be 1 or more"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--limits.wait", "-1"],
     "--limits.wait must be 0 or more"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--web.max-connections", "1"],
     "--web.max-connections must be 2 or more"),
    (["--prometheus-url", "http://127.0.0.1:9090", "--web.max-connections-per-client", "-1"],
     "--web.max-connections-per-client must be 0 or more"),
])
def test_the_proxy_says_what_is_wrong_and_exits_2(args: list[str], message: str) -> None:
    result = subprocess.run([PROXY, *args], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
