"""Every query in docs/promql.md runs against a real Prometheus and answers."""

from __future__ import annotations

import re
import time

import pytest

from tests.support import REPO
from tests.system.observe.conftest import Stack

pytestmark = pytest.mark.prometheus

DOC = REPO / "docs" / "promql.md"
BLOCK = re.compile(r"```promql\n(.*?)```", re.S)
# Queries that are empty when all is well, as the page says.
EMPTY_WHEN_HEALTHY = ("slurm_gpu_exporter_last_sample_timestamp_seconds >",
                      "slurm_gpu_exporter_nvml_up == 0")


def doc_queries() -> list[str]:
    return [q.strip() for q in BLOCK.findall(DOC.read_text())]


def test_the_page_has_queries() -> None:
    assert len(doc_queries()) >= 15


def test_every_documented_query_answers(stack: Stack) -> None:
    stack.node.wait_for("jobid_user:slurm_job_gpus_held_idle:count_rate5m")
    time.sleep(max(0.0, stack.started + 8 - time.time()))
    (info,) = stack.node.vector('slurm_job_info{name="idle-train"}')
    jobid, user = info["metric"]["jobid"], info["metric"]["user"]
    failures = []
    for query in doc_queries():
        expr = query.replace("123456", jobid).replace('"alice"', f'"{user}"')
        answer = stack.node.query(expr)
        if answer["status"] != "success":
            failures.append(f"{query}\n  error: {answer.get('error')}")
            continue
        result = answer["data"]["result"]
        if any(marker in query for marker in EMPTY_WHEN_HEALTHY):
            if result:
                failures.append(f"{query}\n  should be empty on a healthy node: {result}")
        elif not result:
            failures.append(f"{query}\n  returned nothing")
    assert not failures, "\n".join(failures)
