#!/usr/bin/env python3
"""Submit -> running latency of `tessera reconcile` on the acme fleet, with a loaded queue.

Starts the release binary on acme's simulated nodes (`--runtime none`, cycle period and fetch
interval 10 minutes, so that only submissions wake a cycle), submits a burst that leaves about
460 workloads running and 1,452 waiting (400 8-GPU gangs of nlp-pretrain, 1,500 one-GPU jobs of
nlp-eval), waits until it settles, then submits ten single workloads one at a time (a 1g.10gb
inference replica of ads-ctr and a one-GPU job of alignment-evals, alternately) and times each
from the POST to the moment the API shows it running. Prints, per mode, the latencies and the
solver's share of those cycles (from /metrics).

Usage, from the repository root, after `cargo build --release`:
    python3 scripts/service_latency.py session full
`session` runs the default service; `full` adds `--full-cycles-only`. Standard library only.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "tessera")
ACME = "examples/policies/acme"
PORT = int(os.environ.get("TESSERA_LATENCY_PORT", "18080"))
ADMIN = "admin-token-0123456789abcdef"
TENANTS = ["ads-ctr", "nlp-eval", "nlp-pretrain", "alignment-evals"]
TOKEN = {t: f"{t}-token-0123456789abcdef" for t in TENANTS}


def call(method, path, token=None, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
    )
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text, name):
    return float(next(l.split()[-1] for l in text.splitlines() if l.startswith(name + " ")))


def settle():
    last = None
    while True:
        st = json.loads(call("GET", "/status")[1])
        quiet = last and st["cycles"] == last["cycles"] and st["lastActions"] == 0
        if st.get("sync") == "Synced" or quiet:
            return st
        last = st
        time.sleep(1.0)


def run(label, extra):
    work = tempfile.mkdtemp(prefix=f"tessera-latency-{label}-")
    with open(f"{work}/tokens.yaml", "w") as f:
        f.write(f"admin: {ADMIN}\ntenants:\n" + "".join(f"  {t}: {k}\n" for t, k in TOKEN.items()))
    service = subprocess.Popen(
        [BIN, "reconcile", "--repo", ROOT, "--path", ACME, "--driver", "sim",
         "--nodes", os.path.join(ROOT, ACME, "state/cluster-state.yaml"), "--runtime", "none",
         "--db", f"{work}/db", "--state-dir", f"{work}/state", "--tokens", f"{work}/tokens.yaml",
         "--listen", f"127.0.0.1:{PORT}", "--cycle-period", "10m", "--fetch-interval", "10m"]
        + extra,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                st = json.loads(call("GET", "/status")[1])
                if st.get("sync") == "Synced" and st.get("cycles", 0) >= 2:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        train = {"sloClass": "batch-training", "pool": "h100-train"}
        burst = [("nlp-pretrain", f"pre-{i}", dict(train, tenant="nlp-pretrain",
                  gpu={"count": 8}, cpu=64, memory="512Gi")) for i in range(400)]
        burst += [("nlp-eval", f"eval-{i}", dict(train, tenant="nlp-eval",
                   gpu={"count": 1}, cpu=8, memory="64Gi")) for i in range(1500)]
        started = time.time()
        with ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda b: call("POST", "/v1/workloads", TOKEN[b[0]],
                                                 {"name": b[1], "spec": b[2]})[0], burst))
        assert all(c == 201 for c in codes), set(codes)
        st = settle()
        time.sleep(2)
        before = call("GET", "/metrics")[1]
        waiting = sum(float(l.split()[-1]) for l in before.splitlines()
                      if l.startswith("tessera_pending_workloads{"))
        print(f"{label}: burst of {len(burst)} settled in {time.time() - started:.1f} s "
              f"({st['cycles']} cycles), {waiting:.0f} waiting", flush=True)
        singles = [
            ("ads-ctr", {"tenant": "ads-ctr", "sloClass": "latency-critical",
                         "pool": "h100-infer", "gpu": {"migProfile": "1g.10gb"},
                         "cpu": 3, "memory": "16Gi"}),
            ("alignment-evals", dict(train, tenant="alignment-evals", gpu={"count": 1},
                                     cpu=8, memory="64Gi")),
        ]
        latencies = []
        for i in range(10):
            tenant, spec = singles[i % 2]
            name = f"single-{i}"
            t0 = time.perf_counter()
            code, text = call("POST", "/v1/workloads", TOKEN[tenant], {"name": name, "spec": spec})
            assert code == 201, (code, text)
            while json.loads(call("GET", f"/v1/workloads/{name}", TOKEN[tenant])[1]).get(
                    "phase") != "running":
                assert time.perf_counter() - t0 < 60, f"{name} never ran"
                time.sleep(0.005)
            latencies.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.5)
        after = call("GET", "/metrics")[1]
        solves = metric(after, "tessera_solve_duration_seconds_count") - metric(
            before, "tessera_solve_duration_seconds_count")
        solve_s = metric(after, "tessera_solve_duration_seconds_sum") - metric(
            before, "tessera_solve_duration_seconds_sum")
        by_session = metric(after, "tessera_session_decisions_total") - metric(
            before, "tessera_session_decisions_total")
        print(f"{label}: submit -> running, ms: median {statistics.median(latencies):.1f}, "
              f"min {min(latencies):.1f}, max {max(latencies):.1f}; "
              f"{solves:.0f} cycles decided ({by_session:.0f} by the session), "
              f"solver {1000 * solve_s / max(solves, 1):.1f} ms a cycle on average", flush=True)
    finally:
        service.terminate()
        service.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    modes = {"session": [], "full": ["--full-cycles-only"]}
    for mode in sys.argv[1:] or ["session", "full"]:
        run(mode, modes[mode])
