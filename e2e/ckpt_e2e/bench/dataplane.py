"""`python -m ckpt_e2e.bench dataplane`: load throughput of the file, http and mooncake (Mooncake
transfer engine over TCP) transports, with and without verification, against limits measured
in the same run (memcpy, raw loopback TCP, one core's xxh3-128 rate), plus
peak extra memory of a streamed load and the rate of `publish --link` (which costs hashing only,
so its limit is the hash rate), and the cost of the load-time finite check (`checks.finite`):
its own rate over the bench's tensors as BF16 and F32, and what it adds to a verified load.
A benchmark, not a test: it prints figures and ratios.

Loads run the agent's own pipeline (`InProcessLoader`, streamed mode: manifest, compatibility
check, chunked reads into one reusable buffer, xxh3-128) into a target that discards the bytes,
so the figures are the data plane's, not paddle's copy into parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt_agent.engines.base import LoadJob
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.compat import ParamSpec
from ckpt_agent.pipeline.finite import FiniteScan
from ckpt_agent.pipeline.loader import ApplyFn, InProcessLoader
from ckpt_agent.pipeline.pause_gate import PauseGate
from ckpt_agent.pipeline.reader import LoadProgress
from ckpt_api.manifest import MANIFEST_NAME, StrongAlgorithm, TensorRecord
from ckpt_source.digests import strong_hasher, xxh3_hasher
from ckpt_source.publish import publish_version
from ckpt_source.safetensors_format import write_file

GB = 1e9
MiB = 1 << 20
VERSION = "bench"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Peak resident memory above the level when it started, sampled every millisecond."""

    def __init__(self) -> None:
        self.baseline = _rss_bytes()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.baseline


def _best_gbps(nbytes: int, repeat: int, run: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / GB


def measure_memcpy(nbytes: int, repeat: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # touched: page faults are not what we measure
    return _best_gbps(nbytes, repeat, lambda: np.copyto(dst, src))


def measure_xxh3(nbytes: int, repeat: int) -> float:
    """One thread's xxh3-128 over a buffer in memory: the limit a hashing publish is held to."""
    data = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8).data

    def once() -> None:
        xxhash.xxh3_128_hexdigest(data)

    return _best_gbps(nbytes, repeat, once)


def measure_digests(nbytes: int, repeat: int, algorithm: StrongAlgorithm = "blake3") -> float:
    """One thread's xxh3-128 and cryptographic digest (blake3 as `publish` computes it, or sha256
    as format 2 did) of each 1 MiB block: what a publish thread hashes per byte."""
    data = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8).data
    block = 1 << 20

    def once() -> None:
        fast, strong = xxh3_hasher(), strong_hasher(algorithm)
        for lo in range(0, nbytes, block):
            part = data[lo : lo + block]
            fast.update(part)
            strong.update(part)

    return _best_gbps(nbytes, repeat, once)


def measure_publish(src: Path, root: Path, repeat: int, digest: StrongAlgorithm = "blake3") -> float:
    """Best GB/s of `publish --link` of `src` (shard bytes over wall time), each run a new version
    beside `root/VERSION`, removed afterwards. The source was just written, so it is in the page
    cache, as a trainer's fresh checkpoint is."""
    best = 0.0
    for i in range(repeat):
        out = root / f"{VERSION}-publish-{digest}-{i}"
        started = time.perf_counter()
        result = publish_version(src, out.name, root, link=True, digest=digest)
        seconds = time.perf_counter() - started
        best = max(best, sum(f.bytes for f in result.files if f.kind == "shard") / seconds / GB)
        shutil.rmtree(out)
    return best


def measure_tcp(nbytes: int, chunk: int, repeat: int) -> float:
    """Raw loopback TCP: one sender thread `sendall`s, the receiver `recv_into`s one buffer."""
    payload = memoryview(np.ones(min(nbytes, 64 * MiB), dtype=np.uint8).data)
    sink = memoryview(np.zeros(chunk, dtype=np.uint8).data)

    def once() -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:

            def send() -> None:
                conn, _ = server.accept()
                with conn:
                    left = nbytes
                    while left:
                        step = min(left, payload.nbytes)
                        conn.sendall(payload[:step])
                        left -= step

            sender = threading.Thread(target=send)
            sender.start()
            with socket.create_connection(server.getsockname()) as sock:
                left = nbytes
                while left:
                    got = sock.recv_into(sink, min(left, chunk))
                    if not got:
                        raise RuntimeError("sender closed early")
                    left -= got
            sender.join()

    return _best_gbps(nbytes, repeat, once)


# FINITE_CHECK_DTYPES: the bench's tensors are scanned as each of these.
FINITE_CHECK_DTYPES = ("BF16", "F32")


def finite_random_bytes(rng: np.random.Generator, nbytes: int) -> memoryview:
    """Random bytes with bit 6 of every byte clear: no exponent is all ones, so they are finite
    read as any float dtype (F32, BF16, F16, FP8), and a finite-checked load passes."""
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    np.bitwise_and(data, 0xBF, out=data)
    return memoryview(data.data)


def write_bench_checkpoint(directory: Path, nbytes: int, tensor_bytes: int, shards: int = 2) -> None:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    count = max(1, nbytes // tensor_bytes)
    per_shard = -(-count // shards)
    for shard in range(shards):
        names = range(shard * per_shard, min(count, (shard + 1) * per_shard))
        tensors = [
            (
                f"t{i:05d}",
                "F32",
                (tensor_bytes // 4,),
                finite_random_bytes(rng, tensor_bytes - tensor_bytes % 4),
            )
            for i in names
        ]
        if tensors:
            with (directory / f"model-{shard + 1:05d}-of-{shards:05d}.safetensors").open("wb") as f:
                write_file(f, tensors)


class DiscardTarget:
    """Accepts any tensor of the manifest and drops the bytes."""

    def __init__(self, tensors: Mapping[str, TensorRecord]) -> None:
        self._specs = {name: ParamSpec(t.dtype, t.shape) for name, t in tensors.items()}

    def parameter_specs(self) -> Mapping[str, ParamSpec]:
        return self._specs

    @contextmanager
    def applying(self) -> Iterator[ApplyFn]:
        yield lambda _entry, _data: None


class _NoEngine:
    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def is_paused(self) -> bool:
        return False


def measure_finite_check(root: Path, nbytes: int, chunk: int, repeat: int) -> dict[str, float]:
    """Best GB/s of the finite check alone over the version's tensor bytes (up to `nbytes` of
    them, in memory), fed in `chunk` pieces as a load feeds it, read as each of
    FINITE_CHECK_DTYPES."""
    manifest = parse_manifest((root / VERSION / MANIFEST_NAME).read_bytes())
    pieces: list[memoryview] = []
    held = 0
    for entry in manifest.tensors:
        if held >= nbytes:
            break
        with (root / VERSION / entry.file).open("rb") as f:
            f.seek(entry.offset)
            data = memoryview(f.read(min(entry.nbytes, nbytes - held)))
        pieces.extend(data[pos : pos + chunk] for pos in range(0, data.nbytes, chunk))
        held += data.nbytes

    def scan(dtype: str) -> None:
        check = FiniteScan(dtype)
        for piece in pieces:
            check.update(piece)
        if check.found is not None:
            raise RuntimeError(f"bench tensors are not finite as {dtype}: {check.found.describe()}")

    return {dtype: _best_gbps(held, repeat, functools.partial(scan, dtype)) for dtype in FINITE_CHECK_DTYPES}


# (verify, check_finite) of each measured load.
_LOAD_VARIANTS = ((False, False), (True, False), (True, True))


def measure_load(
    uri: str, target: DiscardTarget, nbytes: int, *, chunk: int, repeat: int
) -> tuple[float, float, float, int]:
    """Best GB/s of a streamed load without verification, with it, and with it and the finite
    check; and the peak extra RSS of one load.

    The variants alternate run by run, so a noisy stretch (shared CPUs) hits all alike instead
    of biasing the cost of verifying or checking. A first load, neither timed nor sampled, sets
    up what a process pays for once (the Mooncake engine's own buffers: ~28 MiB here)."""
    loader = InProcessLoader(target, apply_mode="streamed", chunk_bytes=chunk)

    def load(job: LoadJob) -> None:
        asyncio.run(loader.load(job, PauseGate(_NoEngine()), LoadProgress()))

    load(LoadJob(VERSION, False, uri, None, None))
    best = dict.fromkeys(_LOAD_VARIANTS, float("inf"))
    peak = 0
    for _ in range(repeat):
        for variant in _LOAD_VARIANTS:
            verify, check_finite = variant
            job = LoadJob(VERSION, verify, uri, None, None, check_finite=check_finite)
            with RssSampler() as rss:
                started = time.perf_counter()
                load(job)
                best[variant] = min(best[variant], time.perf_counter() - started)
            peak = max(peak, rss.extra_bytes)
    plain, verified, checked = (nbytes / best[v] / GB for v in _LOAD_VARIANTS)
    return plain, verified, checked, peak


@contextmanager
def source_server(root: Path, *extra: str) -> Iterator[str]:
    """`ckpt-rollout serve` in its own process, as in production; yields its URL."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ckpt_agent",
            "serve",
            str(root),
            "--port",
            "0",
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if extra else None,  # the Mooncake engine logs connections
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the banner, printed once the socket is bound
        match = re.search(r"(http://\S+)", line)
        if not match:
            raise RuntimeError(f"serve did not start: {line!r}")
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_dataplane(
    size_mb: int, tensor_mb: int, chunk_mb: int, repeat: int, workdir: str | None
) -> dict[str, Any]:
    chunk = chunk_mb * MiB
    results: dict[str, Any] = {
        "size_mb": size_mb,
        "tensor_mb": tensor_mb,
        "chunk_mb": chunk_mb,
        "cpus": os.cpu_count(),
    }

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log("measuring memcpy, xxh3-128 and loopback TCP ...")
    results["memcpy_gbps"] = measure_memcpy(min(size_mb, 256) * MiB, repeat)
    results["xxh3_gbps"] = measure_xxh3(min(size_mb, 256) * MiB, repeat)
    results["digests_gbps"] = measure_digests(min(size_mb, 256) * MiB, repeat)
    # What format 2 hashed (sha256), for the record of what blake3 saved.
    results["digests_sha256_gbps"] = measure_digests(min(size_mb, 256) * MiB, repeat, "sha256")
    results["tcp_gbps"] = measure_tcp(size_mb * MiB, chunk, repeat)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="ckpt-bench-") as tmp:
        root = Path(tmp) / "root"
        log(f"publishing a {size_mb} MiB checkpoint ...")
        write_bench_checkpoint(Path(tmp) / "src", size_mb * MiB, tensor_mb * MiB)
        publish_version(Path(tmp) / "src", VERSION, root)
        results["publish_gbps"] = measure_publish(Path(tmp) / "src", root, repeat)
        results["publish_sha256_gbps"] = measure_publish(Path(tmp) / "src", root, repeat, "sha256")
        log("measuring the finite check ...")
        results["finite_check_gbps"] = measure_finite_check(root, min(size_mb, 256) * MiB, chunk, repeat)
        shutil.rmtree(Path(tmp) / "src")
        manifest = parse_manifest((root / VERSION / MANIFEST_NAME).read_bytes())
        target = DiscardTarget({t.name: t for t in manifest.tensors})
        nbytes = manifest.tensor_bytes
        peaks: dict[str, int] = {}

        def measure(name: str, uri: str) -> None:
            log(f"loading over {name} ...")
            plain, verified, checked, extra = measure_load(uri, target, nbytes, chunk=chunk, repeat=repeat)
            results[f"{name}_gbps"], results[f"{name}_verify_gbps"] = plain, verified
            results[f"{name}_verify_finite_gbps"] = checked
            peaks[name] = extra

        measure("file", f"file://{root}")
        with source_server(root) as url:
            measure("http", url)
        try:
            from ckpt_agent.transport.mooncake.runtime import check_available

            check_available()
        except RuntimeError as exc:
            log(f"skipping mooncake: {exc}")
            results["mooncake_gbps"] = results["mooncake_verify_gbps"] = None
            results["mooncake_verify_finite_gbps"] = None
            results["mooncake_peak_extra_rss_mb"] = results["mooncake_rss_budget_mb"] = None
        else:
            from ckpt_agent.transport.mooncake.client import BOUNCE_BYTES

            with source_server(root, "--mooncake", "tcp") as url:
                measure("mooncake", url.replace("http://", "mooncake://"))
            results["mooncake_peak_extra_rss_mb"] = peaks["mooncake"] / MiB
            results["mooncake_rss_budget_mb"] = (
                chunk_mb + manifest.largest_tensor_bytes / MiB + BOUNCE_BYTES / MiB
            )
        results["largest_tensor_mb"] = manifest.largest_tensor_bytes / MiB
    results["peak_extra_rss_mb"] = max(peaks["file"], peaks["http"]) / MiB
    results["rss_budget_mb"] = chunk_mb + results["largest_tensor_mb"]
    results["ratios"] = {
        "http_over_tcp": results["http_gbps"] / results["tcp_gbps"],
        "file_over_memcpy": results["file_gbps"] / results["memcpy_gbps"],
        "file_verify_cost": 1 - results["file_verify_gbps"] / results["file_gbps"],
        "http_verify_cost": 1 - results["http_verify_gbps"] / results["http_gbps"],
        "publish_over_xxh3": results["publish_gbps"] / results["xxh3_gbps"],
        # What publish computes per byte (xxh3 + blake3) on one core: the fair limit of one thread.
        "publish_over_digests": results["publish_gbps"] / results["digests_gbps"],
        # The check's own time over the verified load's time, for the same bytes (its slowest
        # dtype); and what it adds to the load when it runs inside it (overlapping the reads).
        "finite_check_over_file_load": results["file_verify_gbps"]
        / min(results["finite_check_gbps"].values()),
        "file_finite_cost": 1 - results["file_verify_finite_gbps"] / results["file_verify_gbps"],
        "http_finite_cost": 1 - results["http_verify_finite_gbps"] / results["http_verify_gbps"],
    }
    r = results["ratios"]
    if results["mooncake_verify_gbps"] is not None:
        r["mooncake_verify_over_tcp"] = results["mooncake_verify_gbps"] / results["tcp_gbps"]
    results["targets_met"] = {
        "http_ge_half_tcp": r["http_over_tcp"] >= 0.5,
        "mooncake_verify_ge_half_tcp": r.get("mooncake_verify_over_tcp", 0.0) >= 0.5,
        "file_ge_half_memcpy": r["file_over_memcpy"] >= 0.5,
        "verify_cost_le_10pct": max(r["file_verify_cost"], r["http_verify_cost"]) <= 0.10,
        "rss_within_budget": results["peak_extra_rss_mb"] <= results["rss_budget_mb"]
        and (
            results["mooncake_peak_extra_rss_mb"] is None  # not measured: no engine here
            or results["mooncake_peak_extra_rss_mb"] <= results["mooncake_rss_budget_mb"]
        ),
        "publish_ge_0_8_xxh3": r["publish_over_xxh3"] >= 0.8,
        "publish_ge_0_8_digests": r["publish_over_digests"] >= 0.8,
        "finite_cost_le_10pct": max(r["file_finite_cost"], r["http_finite_cost"]) <= 0.10,
    }
    return results


def format_report(r: dict[str, Any]) -> str:
    ratios, met = r["ratios"], r["targets_met"]

    def mark(ok: bool) -> str:
        return "ok  " if ok else "MISS"

    return "\n".join(
        [
            f"dataplane bench: {r['size_mb']} MiB, {r['tensor_mb']} MiB tensors, {r['chunk_mb']} MiB chunks, "
            f"{r['cpus']} CPUs",
            f"  memcpy            {r['memcpy_gbps']:7.2f} GB/s",
            f"  xxh3-128, 1 core  {r['xxh3_gbps']:7.2f} GB/s",
            f"  xxh3+blake3, 1 core {r['digests_gbps']:5.2f} GB/s   (xxh3+sha256, format 2: "
            f"{r['digests_sha256_gbps']:.2f} GB/s)",
            f"  loopback tcp      {r['tcp_gbps']:7.2f} GB/s",
            f"  file load         {r['file_gbps']:7.2f} GB/s   verify {r['file_verify_gbps']:7.2f} GB/s",
            f"  http load         {r['http_gbps']:7.2f} GB/s   verify {r['http_verify_gbps']:7.2f} GB/s",
            f"  [{mark(met['http_ge_half_tcp'])}] http / tcp        "
            f"{ratios['http_over_tcp']:.2f}  (target >= 0.5)",
            f"  mooncake load     {_gbps(r['mooncake_gbps'])} GB/s   "
            f"verify {_gbps(r['mooncake_verify_gbps'])} GB/s",
            f"  [{mark(met['mooncake_verify_ge_half_tcp'])}] mooncake verify / tcp "
            f"{ratios.get('mooncake_verify_over_tcp', float('nan')):.2f}  (target >= 0.5)",
            f"  [{mark(met['file_ge_half_memcpy'])}] file / memcpy     "
            f"{ratios['file_over_memcpy']:.2f}  (target >= 0.5)",
            f"  [{mark(met['verify_cost_le_10pct'])}] verify cost       "
            f"file {ratios['file_verify_cost']:.1%}, http {ratios['http_verify_cost']:.1%}  (target <= 10%)",
            f"  [{mark(met['rss_within_budget'])}] peak extra RSS    "
            f"file/http {r['peak_extra_rss_mb']:.1f} MiB  "
            f"(budget: chunk + largest tensor = {r['rss_budget_mb']:.1f} MiB)",
            *(
                [
                    f"                           mooncake  {r['mooncake_peak_extra_rss_mb']:.1f} MiB  "
                    f"(budget: that + its bounce buffer = {r['mooncake_rss_budget_mb']:.1f} MiB)"
                ]
                if r["mooncake_peak_extra_rss_mb"] is not None
                else []
            ),
            f"  publish --link    {r['publish_gbps']:7.2f} GB/s   (--digest sha256, format 2: "
            f"{r['publish_sha256_gbps']:.2f} GB/s)",
            f"  [{mark(met['publish_ge_0_8_xxh3'])}] publish / xxh3    "
            f"{ratios['publish_over_xxh3']:.2f}  (target >= 0.8; publish hashes blake3 too)",
            f"  [{mark(met['publish_ge_0_8_digests'])}] publish / digests "
            f"{ratios['publish_over_digests']:.2f}  (target >= 0.8)",
            "  finite check      "
            + ", ".join(f"{dtype} {gbps:.2f} GB/s" for dtype, gbps in r["finite_check_gbps"].items())
            + f"  ({ratios['finite_check_over_file_load']:.1%} of a verified file load's time alone)",
            f"  file load verify+finite {r['file_verify_finite_gbps']:7.2f} GB/s   "
            f"http {r['http_verify_finite_gbps']:7.2f} GB/s",
            f"  [{mark(met['finite_cost_le_10pct'])}] finite check cost "
            f"file {ratios['file_finite_cost']:.1%}, http {ratios['http_finite_cost']:.1%}  (target <= 10%)",
        ]
    )


def _gbps(value: float | None) -> str:
    return f"{value:7.2f}" if value is not None else "    n/a"


def main_dataplane(args: argparse.Namespace) -> int:
    results = run_dataplane(args.size_mb, args.tensor_mb, args.chunk_mb, args.repeat, args.dir)
    if args.json:
        print(format_report(results), file=sys.stderr)
        print(json.dumps(results, sort_keys=True))
    else:
        print(format_report(results))
    return 0


if __name__ == "__main__":
    # `python -m ckpt_e2e.bench.dataplane [flags]`, the same as `python -m ckpt_e2e.bench dataplane`.
    from ckpt_e2e.bench.cli import main

    sys.exit(main(["dataplane", *sys.argv[1:]]))
