"""The two-node demonstration of docs/scale.md (issue 15), unattended: an experiment file run on a Ray cluster of
two nodes on this machine, a worker and the driver killed once each, resumed, and compared with the local backend.

    .venv/bin/python benchmarks/two_node.py [FILE] [--out DIR] [--context-mb MB] [--nice N] [--timeout S]

FILE defaults to docs/examples/experiment_two_node.toml; DIR (default: a new folder under /tmp) receives
``ray.sqlite``, ``local.sqlite`` (each with its ``.bank`` cache), ``report/``, ``logs/`` and ``timings.json``.

1. ``ray start --head`` and ``ray start --address=...`` (one CPU each, Ray's files in a new temporary folder, free
   ports, token authentication with a token of its own): the head and the second node of one cluster;
2. ``walklens experiment run FILE --backend ray --address 127.0.0.1:PORT --workers 2 --db DIR/ray.sqlite``; once
   its first groups are stored, one worker process (an actor of the second node) is SIGKILLed (Ray restarts it
   and retries its shard), and once the database keeps shards of a run in progress (Test 2 cut into item ranges
   by ``--context-mb``), the driver is SIGKILLed;
3. the same command again: it resumes, and runs to the end;
4. ``walklens experiment run FILE --backend local --db DIR/local.sqlite``;
5. the two databases compared table by table (:func:`compare`: every sweep run's baseline picks and accuracies,
   every group's stored accuracies and picks, every baseline row, bit for bit); one verdict line and the timings;
6. ``walklens report --db DIR/ray.sqlite --out DIR/report``.

The cluster is stopped at the end, also on failure or Ctrl-C: its own processes, found by their temporary folder,
by process id (``ray stop`` would stop every Ray instance of this machine, other people's too).  Exit status 0
when the databases are identical and both kills happened, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

#: Each table's columns compared (everything but ids, timestamps and seconds), and the key a row is matched by.
TABLES: dict[str, tuple[str, str]] = {
    "results": ("model, data, split, shots, test, scheme, item, gold, pred, pred_norm, scores", ""),
    "runs": ("model, data, split, shots, test, scheme, n, acc, acc_norm", ""),
    "sweep_runs": (
        "model, data, split, shots, test, items_hash, n_items, labels, item_index, arch, n_layers, "
        "baseline_acc, baseline_acc_norm, baseline_preds",
        "",
    ),
    "sweep_groups": (
        "r.model, r.data, r.split, r.shots, r.test, r.items_hash, g.context, g.outs, g.metrics, g.acc, g.preds",
        "g JOIN {db}.sweep_runs r ON g.run_id = r.id",
    ),
    "sweep_shards": ("run_id, shard, shape, preds", ""),
}


def compare(a: Path, b: Path) -> dict[str, dict[str, int]]:
    """Table by table: rows in ``a``, rows in ``b``, and rows of either that the other does not hold with the very
    same values (SQLite compares BLOBs byte by byte and REALs exactly; ids, timestamps and seconds left out)."""
    con = sqlite3.connect(":memory:", uri=True)
    try:
        for name, path in (("a", a), ("b", b)):
            con.execute(f"ATTACH DATABASE ? AS {name}", (f"file:{path}?mode=ro",))
        out = {}
        for table, (cols, join) in TABLES.items():

            def q(db: str, cols: str = cols, table: str = table, join: str = join) -> str:
                return f"SELECT {cols} FROM {db}.{table} {join.format(db=db)}"

            n = {db: con.execute(f"SELECT count(*) FROM ({q(db)})").fetchone()[0] for db in ("a", "b")}
            diff = sum(
                con.execute(f"SELECT count(*) FROM ({q(x)} EXCEPT {q(y)})").fetchone()[0]
                for x, y in (("a", "b"), ("b", "a"))
            )
            out[table] = {"a": n["a"], "b": n["b"], "differing": diff}
        return out
    finally:
        con.close()


def identical(cmp: dict[str, dict[str, int]]) -> bool:
    """Every table holds the same rows in both, the sweep tables are not empty and no shard is left over."""
    return (
        all(c["a"] == c["b"] and c["differing"] == 0 for c in cmp.values())
        and cmp["sweep_groups"]["a"] > 0
        and cmp["sweep_shards"]["a"] == 0
    )


def stored(db: Path, table: str = "sweep_groups") -> int:
    """Rows of a sweep table so far (0 before the database or its tables exist)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
            return int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.Error:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processes() -> dict[int, tuple[int, str]]:
    """Every process of this machine: ``{pid: (parent pid, command line)}`` (from /proc)."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, IndexError, ValueError):
                continue
            out[int(p.name)] = (ppid, cmd)
    return out


class Cluster:
    """A head node and a second node on this machine, one CPU each; everything of theirs lives in ``tmp``, by which
    :meth:`pids` finds their processes (and the processes those started) and :meth:`stop` ends them."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="wl2n-", dir="/tmp"))  # short: Ray's socket paths must fit 107 chars
        token = self.tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log
        self.raylets: list[int] = []

    def _ports(self) -> list[str]:
        return [
            f"--{k}={free_port()}"
            for k in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "runtime-env-agent-port",
                "metrics-export-port",
            )
        ]

    def _start(self, args: list[str]) -> None:
        before = set(self.pids("raylet"))
        with open(self.log, "a") as f:
            subprocess.run(
                [
                    str(BIN / "ray"),
                    "start",
                    "--node-ip-address=127.0.0.1",
                    "--num-cpus=1",
                    f"--object-store-memory={512 * 2**20}",
                    "--disable-usage-stats",
                    *self._ports(),
                    *args,
                ],
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=300,
            )
        self.raylets += sorted(set(self.pids("raylet")) - before)

    def start(self) -> None:
        self._start(
            [
                "--head",
                f"--port={self.port}",
                f"--temp-dir={self.tmp}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
            ]
        )
        self._start([f"--address={self.address}"])

    def pids(self, program: str = "") -> list[int]:
        """This cluster's processes: those whose command line names its folder, and their descendants
        (``program``: only the folder-named processes running that program, e.g. ``raylet``)."""
        procs = processes()
        roots = [
            p
            for p, (_, cmd) in procs.items()
            if str(self.tmp) in cmd and p != os.getpid() and (not program or cmd.split()[0].endswith("/" + program))
        ]
        if program:
            return roots
        found, todo = set(roots), list(roots)
        while todo:
            parent = todo.pop()
            kids = [p for p, (pp, _) in procs.items() if pp == parent and p not in found]
            found.update(kids)
            todo += kids
        return sorted(found)

    def actor(self) -> int | None:
        """A walklens worker (an actor holding the model) of the second node, else of the head."""
        procs = processes()
        for raylet in self.raylets[::-1]:
            for p, (pp, cmd) in procs.items():
                if pp == raylet and cmd.startswith("ray::ShardWorker"):
                    return p
        return None

    def stop(self) -> None:
        """SIGTERM to every process of the cluster, SIGKILL to those left after 15 s; then its folder goes."""
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for p in pids:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end and any(_alive(p) for p in pids):
                time.sleep(0.5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped by its parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_until(test: Callable[[], bool], proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Poll ``test`` every half second while ``proc`` runs; False if it ended (or ``timeout`` passed) first."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        if test():
            return True
        time.sleep(0.5)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "file",
        nargs="?",
        default=str(ROOT / "docs/examples/experiment_two_node.toml"),
        help="the experiment file (default: docs/examples/experiment_two_node.toml)",
    )
    ap.add_argument("--out", default=None, help="output folder (default: a new folder under /tmp)")
    ap.add_argument(
        "--context-mb",
        type=float,
        default=2.0,
        help="bound on a Test 2 item range's bank rows ($WALKLENS_RAY_CONTEXT_MB; default 2: several "
        "ranges, so the demonstration cuts Test 2 by items)",
    )
    ap.add_argument("--nice", type=int, default=5, help="niceness of everything it starts (default 5)")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds each command may take (default 7200)")
    args = ap.parse_args()
    exp = Path(args.file).resolve()
    if not exp.is_file():
        ap.error(f"{args.file}: no such experiment file")
    if not args.context_mb > 0:
        ap.error("--context-mb must be positive")
    out = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="two_node-", dir="/tmp"))
    ray_db, local_db, report = out / "ray.sqlite", out / "local.sqlite", out / "report"
    for p in (ray_db, local_db, report, Path(f"{ray_db}.bank"), Path(f"{local_db}.bank")):
        if p.exists():
            ap.error(f"{p} exists: use a new --out folder (nothing is replaced)")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.nice(args.nice)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "WALKLENS_RAY_CONTEXT_MB": str(args.context_mb),
    }
    walklens = [sys.executable, "-m", "walklens"]
    t: dict[str, float] = {}
    facts: dict[str, Any] = {"file": str(exp), "out": str(out), "context_mb": args.context_mb}

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    started: list[subprocess.Popen[Any]] = []

    def run(name: str, cmd: list[str], cluster_env: dict[str, str]) -> subprocess.Popen[Any]:
        say(f"{name}: walklens {' '.join(cmd[3:])}")
        with open(out / "logs" / f"{name}.log", "w") as f:
            started.append(subprocess.Popen(cmd, env=cluster_env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT))
        return started[-1]

    def finish(name: str, p: subprocess.Popen[Any]) -> int:
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc != 0:
            say(f"{name}: exit status {rc}; its log: {out / 'logs' / (name + '.log')}")
        return rc

    def terminated(signum: int, frame: object) -> None:  # SIGTERM/SIGHUP: unwind, so `finally` stops the cluster
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    t0 = time.monotonic()
    cluster = Cluster(env, out / "logs" / "ray_start.log")
    try:
        say(f"starting the two nodes (Ray's files in {cluster.tmp})")
        cluster.start()
        t["cluster_start"] = time.monotonic() - t0
        ray_cmd = [
            *walklens,
            "experiment",
            "run",
            str(exp),
            "--backend",
            "ray",
            "--address",
            cluster.address,
            "--workers",
            "2",
            "--db",
            str(ray_db),
            "--no-progress",
        ]
        # 2. the Ray run: a worker killed once its first groups are in
        t1 = time.monotonic()
        driver = run("ray_1", ray_cmd, cluster.env)
        if wait_until(lambda: stored(ray_db) > 0, driver, args.timeout):
            facts["groups_at_worker_kill"] = stored(ray_db)
            pid = cluster.actor()
            if pid is None:
                say("no worker process found to kill")
            else:
                os.kill(pid, signal.SIGKILL)
                facts["worker_killed"] = pid
                say(f"killed worker process {pid} (SIGKILL) with {facts['groups_at_worker_kill']} groups stored")
        # the driver: once it keeps shards (mid-evaluation of a run cut into ranges, its bank built: a forward pass
        # resumed in other batches could change a vector's last bits, docs/scale.md)
        if "worker_killed" in facts and wait_until(lambda: stored(ray_db, "sweep_shards") > 0, driver, args.timeout):
            driver.send_signal(signal.SIGKILL)
            driver.wait()
            facts["groups_at_driver_kill"] = stored(ray_db)
            facts["shards_at_driver_kill"] = stored(ray_db, "sweep_shards")
            say(
                f"killed the driver (SIGKILL) with {facts['groups_at_driver_kill']} groups and "
                f"{facts['shards_at_driver_kill']} shards stored"
            )
        else:
            say("the Ray run ended before it could be killed as planned")
            finish("ray_1", driver)
        t["ray_until_killed"] = time.monotonic() - t1
        # 3. the same command again: it resumes
        t2 = time.monotonic()
        rc = finish("ray_2", run("ray_2", ray_cmd, cluster.env))
        t["ray_resumed"] = time.monotonic() - t2
        if rc != 0:
            return 1
    finally:
        for p in started:  # a command still running (Ctrl-C, an error here): ended before its cluster
            if p.poll() is None:
                p.kill()
                p.wait()
        t_stop = time.monotonic()
        say("stopping the cluster")
        cluster.stop()
        t["cluster_stop"] = time.monotonic() - t_stop
    # 4. the local backend, 5. the comparison, 6. the report
    t3 = time.monotonic()
    rc = finish(
        "local",
        run(
            "local",
            [*walklens, "experiment", "run", str(exp), "--backend", "local", "--db", str(local_db), "--no-progress"],
            env,
        ),
    )
    t["local"] = time.monotonic() - t3
    if rc != 0:
        return 1
    cmp = compare(ray_db, local_db)
    same = identical(cmp)
    t4 = time.monotonic()
    rc_report = finish("report", run("report", [*walklens, "report", "--db", str(ray_db), "--out", str(report)], env))
    t["report"] = time.monotonic() - t4
    t["total"] = time.monotonic() - t0
    killed = "worker_killed" in facts and "groups_at_driver_kill" in facts
    facts.update(identical=same, tables=cmp, seconds=t, report=str(report) if rc_report == 0 else None)
    (out / "timings.json").write_text(json.dumps(facts, indent=2), encoding="utf-8")
    for table, c in cmp.items():
        say(f"  {table}: {c['a']} rows (ray) / {c['b']} rows (local), {c['differing']} differing")
    say(f"timings (s): {', '.join(f'{k} {v:.0f}' for k, v in t.items())}")
    verdict = "IDENTICAL to the local backend" if same else "DIFFERENT from the local backend"
    kills = (
        f"a worker killed at {facts['groups_at_worker_kill']} groups, the driver at "
        f"{facts['groups_at_driver_kill']} groups and {facts['shards_at_driver_kill']} kept shards, resumed"
        if killed
        else "NOT killed as planned"
    )
    t_ray = t["ray_until_killed"] + t["ray_resumed"]
    print(
        f"VERDICT: two-node Ray run ({kills}) {verdict}: {cmp['sweep_runs']['a']} sweep runs, "
        f"{cmp['sweep_groups']['a']} groups, {cmp['results']['a']} baseline rows; Ray {t_ray:.0f} s, local "
        f"{t['local']:.0f} s, total {t['total']:.0f} s; report {report if rc_report == 0 else 'FAILED'}",
        flush=True,
    )
    return 0 if same and killed and rc_report == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
