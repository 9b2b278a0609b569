"""Which jobs ``archive`` takes from the query answers: pure logic over Samples."""

from __future__ import annotations

from slurm_gpu_exporter.report.archive import _ended_everywhere, archive_queries
from slurm_gpu_exporter.report.promql import Sample
from slurm_gpu_exporter.report.queries import Filters
from slurm_gpu_exporter.report.window import Window


def _s(jobid: str, instance: str, cluster: str = "", value: float = 1.0) -> Sample:
    labels = {"jobid": jobid, "instance": instance}
    if cluster:
        labels["cluster"] = cluster
    return Sample(labels, value)


def test_a_job_is_archived_only_once_every_node_it_ran_on_has_sampled_its_end() -> None:
    got = {
        "info": [_s("1", "a:9400"), _s("1", "b:9400"), _s("2", "a:9400"), _s("3", "a:9400"),
                 _s("3", "a:9400", cluster="east")],
        "end": [_s("1", "a:9400"), _s("2", "a:9400"), _s("3", "a:9400", cluster="east")],
    }
    # Job 1 still runs on b; job 3 of the unlabelled cluster has not ended.
    assert _ended_everywhere(got, "cluster") == {("", "2"), ("east", "3")}


def test_archive_makes_the_same_queries_whatever_the_jobs_and_needs_no_baseline() -> None:
    queries = archive_queries(Window(0, 7200), Filters(cluster="east"))
    assert len(queries) == 14
    assert all("offset" not in q for q in queries.values())
    assert all('cluster="east"' in q for q in queries.values())
