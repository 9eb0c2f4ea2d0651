"""A real Prometheus server for monitoring tests: scrapes the operator and the agents on
loopback, evaluates the chart's alert rules, answers PromQL.

Targets are file_sd files the test (re)writes once pods are up; Prometheus picks changes up
through inotify, no reload needed. The server binds port 0 and the harness reads the port the
kernel gave it from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .procs import WaitTimeout, listening_ports, spawn, stop, wait_for
from .provision import resolve

SCRAPE_INTERVAL_S = 1


class PromQLError(AssertionError):
    """Prometheus refused a query; the message carries its error and the query."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Job:
    """One scrape job: its name and whether the target's own labels win over the target's
    (the operator's per-CR `namespace` label must not become `exported_namespace`)."""

    name: str
    honor_labels: bool = False


def scrape_config(jobs: Sequence[Job], sd_dir: Path, rule_files: Sequence[Path]) -> dict[str, Any]:
    interval = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job.name,
                "honor_labels": job.honor_labels,
                "file_sd_configs": [{"files": [str(sd_dir / f"{job.name}.json")]}],
            }
            for job in jobs
        ],
    }


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, sd_dir: Path, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.sd_dir = sd_dir
        self.log_path = log_path

    def set_targets(self, job: str, targets: Mapping[str, Mapping[str, str]]) -> None:
        """``targets``: host:port -> extra target labels. Written atomically: Prometheus must
        never read half a file."""
        groups = [{"targets": [address], "labels": dict(labels)} for address, labels in targets.items()]
        path = self.sd_dir / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, path)

    def api(self, path: str, params: Mapping[str, str] | None = None, timeout: float = 5.0) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=timeout) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[Sample]:
        """An instant query; vectors and scalars both come back as samples."""
        data = self.api("/api/v1/query", {"query": promql})
        if data["resultType"] in ("scalar", "string"):
            return [Sample({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise PromQLError(f"{promql}: a {data['resultType']}, expected an instant vector")
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def by(self, promql: str, label: str) -> dict[str, float]:
        """``promql``'s samples keyed by one label (which must tell them apart)."""
        samples = self.query(promql)
        found = {s.labels.get(label, ""): s.value for s in samples}
        assert len(found) == len(samples), f"{promql}: {label!r} does not tell {samples} apart"
        return found

    def one(self, promql: str) -> float:
        samples = self.query(promql)
        assert len(samples) == 1, f"{promql}: expected one sample, got {samples}"
        return samples[0].value

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/targets", {"state": "active"})["activeTargets"])

    def wait_scraped(self, jobs: Mapping[str, int], after: float, timeout: float = 30.0) -> None:
        """Until every job has its expected number of targets, each up and scraped (its scrape
        started) after the Unix time ``after``: queries then see what the targets held then."""
        seen: list[dict[str, Any]] = []

        def fresh() -> bool:
            seen[:] = self.targets()
            for job, count in jobs.items():
                mine = [t for t in seen if t["labels"].get("job") == job]
                if len(mine) != count:
                    return False
                for t in mine:
                    scraped = _parse_rfc3339(t["lastScrape"])
                    if t["health"] != "up" or scraped is None or scraped <= after:
                        return False
            return True

        try:
            wait_for(fresh, timeout, f"targets of {dict(jobs)} scraped after {after:.1f}", interval=0.2)
        except WaitTimeout as exc:
            states = [(t["scrapeUrl"], t["health"], t["lastScrape"], t["lastError"]) for t in seen]
            raise WaitTimeout(f"{exc}; targets: {states}") from None


def _parse_rfc3339(value: str) -> float | None:
    """Prometheus's lastScrape (RFC 3339, nanoseconds; year 1 before the first scrape)."""
    stamp = datetime.fromisoformat(value)
    return None if stamp.year == 1 else stamp.timestamp()


@contextmanager
def prometheus_server(
    work: Path, jobs: Sequence[Job], rule_files: Sequence[Path] = (), startup_s: float = 60.0
) -> Iterator[Prometheus]:
    binary = resolve(["prometheus"])["prometheus"]
    sd_dir = work / "sd"
    sd_dir.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        (sd_dir / f"{job.name}.json").write_text("[]")
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(jobs, sd_dir, rule_files)))
    log_path = work / "prometheus.log"
    proc = spawn(
        [
            binary,
            f"--config.file={config}",
            "--web.listen-address=127.0.0.1:0",
            f"--storage.tsdb.path={work / 'tsdb'}",
            # Alerts evaluated in tests have no Alertmanager to go to.
            "--rules.alert.resend-delay=1s",
        ],
        log_path,
    )
    try:
        url = _bound_url(proc, log_path, startup_s)
        server = Prometheus(proc, url, sd_dir, log_path)
        wait_for(lambda: _ready(url), startup_s, "prometheus /-/ready", interval=0.2)
        yield server
    finally:
        stop(proc)


def _bound_url(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> str:
    def bound() -> int | None:
        if proc.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"prometheus exited with {proc.returncode}; {log_path}:\n{tail}")
        ports = [port for host, port in listening_ports({proc.pid}) if host == "127.0.0.1"]
        return ports[0] if len(ports) == 1 else None

    return f"http://127.0.0.1:{wait_for(bound, timeout, 'prometheus to bind its port', interval=0.1)}"


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
