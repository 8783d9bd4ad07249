"""Runs the side-by-side benchmark inside the network namespace ``run.sh`` made: Mooncake's
processes, then a Regolith cluster, each with ``workload.py`` as the client in its own virtual
environment, and merges the two reports with the machine's ceilings. Standard library only.

    python3 driver.py --target DIR --mooncake-venv DIR --regolith-venv DIR [--duration S]
                      [--filter F] [--json] [--commit SHA]

Every process it starts is stopped (SIGTERM, then SIGKILL) before it exits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
MOONCAKE_MASTER = "127.0.0.1:50051"
READY = "ready: Ctrl-C or SIGTERM stops the cluster"
REGOLITH_BASE_PORT = 21000


def log(msg: str) -> None:
    print(f"[vs-mooncake {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Procs:
    """The processes this run started, stopped in reverse order."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.live: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        f = open(self.logdir / f"{name}.log", "ab")
        p = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
        f.close()
        self.live.append((name, p))
        return p

    def stop(self, name: str | None = None, timeout: float = 30) -> None:
        for n, p in reversed(list(self.live)):
            if name is not None and n != name:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            self.live.remove((n, p))

    def check(self) -> None:
        for n, p in self.live:
            if p.poll() is not None:
                raise RuntimeError(f"{n} exited ({p.returncode}):\n{tail(self.logdir / f'{n}.log')}")


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def wait_port(addr: str, procs: Procs, timeout: float = 60) -> None:
    host, port = addr.rsplit(":", 1)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        procs.check()
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {addr} after {timeout}s")


def wait_file(path: Path, procs: Procs, timeout: float = 120) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        procs.check()
        if path.exists():
            return path.read_text().strip()
        time.sleep(0.1)
    raise RuntimeError(f"{path} did not appear within {timeout}s")


def workload(venv: Path, out: Path, system: str, remote: str, master: str, a, env: dict) -> dict:
    args = [str(venv / "bin" / "python"), "-P", str(WORKLOAD), "run", "--system", system,
            "--remote", remote, "--master", master, "--out", str(out),
            "--duration", str(a.duration), "--filter", a.filter]  # fmt: skip
    log(f"{system}: the workload ({' '.join(args[2:])})")
    # Its per-row progress goes to our stderr; Mooncake's own logging (glog on stderr) is
    # filtered to its warnings and errors, and kept whole in the log dir.
    with open(a.logdir / f"{system}-client.log", "wb") as f:
        p = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        assert p.stderr is not None
        for line in p.stderr:
            f.write(line)
            text = line.decode(errors="replace")
            if text.startswith("  ") or text.startswith(system) or text.startswith("warning"):
                sys.stderr.write(text)
                sys.stderr.flush()
        rc = p.wait()
    if rc != 0:
        raise RuntimeError(f"{system} workload failed ({rc}):\n{tail(a.logdir / f'{system}-client.log')}")
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------- phases


def run_mooncake(a) -> dict:
    procs = Procs(a.logdir)
    bin_dir = a.mooncake_venv / "bin"
    env = dict(os.environ)
    # Mooncake's transfer engine binds its RPC port to the first non-loopback address it finds
    # unless told one; the namespace has loopback only.
    env["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    try:
        log("mooncake: mooncake_master, mooncake.http_metadata_server, the holder")
        procs.start("mooncake-master", [str(bin_dir / "mooncake_master"), "--rpc_port=50051",
                                        "--metrics_port=9003"], env)  # fmt: skip
        procs.start("mooncake-metadata", [str(bin_dir / "python"), "-m",
                    "mooncake.http_metadata_server", "--host", "127.0.0.1", "--port", "8080"], env)  # fmt: skip
        wait_port(MOONCAKE_MASTER, procs)
        wait_port("127.0.0.1:8080", procs)
        name_file = a.logdir / "holder.name"
        name_file.unlink(missing_ok=True)
        procs.start("mooncake-holder", [str(bin_dir / "python"), "-P", str(WORKLOAD), "hold",
                    "--master", MOONCAKE_MASTER, "--name-file", str(name_file)], env)  # fmt: skip
        holder = wait_file(name_file, procs)
        log(f"mooncake: holder segment {holder}")
        return workload(a.mooncake_venv, a.logdir / "mooncake.json", "mooncake", holder,
                        MOONCAKE_MASTER, a, env)  # fmt: skip
    finally:
        procs.stop()


def run_regolith(a) -> tuple[dict, dict]:
    procs = Procs(a.logdir)
    rel = a.target / "release"
    cli = rel / "regolith"
    d = Path(tempfile.mkdtemp(prefix="regolith-vsmc-", dir=a.logdir))
    try:
        log("regolith: regolith up (3 metad replicas, fsync on; 2 sidecars, 1 GiB segments)")
        up = procs.start("regolith-up", [str(cli), "up", "--dir", str(d), "--metad", "3",
                         "--sidecars", "2", "--segment-size", "1GiB",
                         "--base-port", str(REGOLITH_BASE_PORT),
                         "--metad-bin", str(rel / "regolith-metad"),
                         "--sidecar-bin", str(rel / "regolith-sidecar")]
                        + (["--no-index"] if a.no_index else []))  # fmt: skip
        end = time.monotonic() + 120
        while READY not in (a.logdir / "regolith-up.log").read_text(errors="replace"):
            procs.check()
            if time.monotonic() > end:
                raise RuntimeError(f"regolith up not ready:\n{tail(a.logdir / 'regolith-up.log')}")
            time.sleep(0.1)
        info = json.loads((d / "cluster.json").read_text())
        sock = info["sidecars"][0]["socket"]
        other = info["sidecars"][1]["name"]
        metad = ",".join(m["grpc"] for m in info["metad"])
        log(f"regolith: client through {sock}, remote segment {other}, metad {metad}")
        log("ceilings: regolith bench (memcpy, one loopback TCP stream, TCP round trip)")
        out = subprocess.run([str(cli), "--dir", str(d), "--socket", sock, "bench", "--json",
                              "--filter", "none"], capture_output=True, text=True, check=True)  # fmt: skip
        ceilings = json.loads(out.stdout)["ceilings"]
        log(f"ceilings: {ceilings}")
        env = dict(os.environ)
        env["REGOLITH_SOCKET"] = sock
        rep = workload(a.regolith_venv, a.logdir / "regolith.json", "regolith", other, metad, a, env)
        rep["cluster"] = {"metad": metad, "sidecars": [s["name"] for s in info["sidecars"]]}
        del up
        return rep, ceilings
    finally:
        procs.stop()


# ---------------------------------------------------------------------------------- report


def human(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def figure(row: dict) -> tuple[str, str, bool]:
    """(label, key, higher is better) of a row's headline figure: p50 latency for single
    small calls, items/s for small batches and existence checks, GB/s for the rest."""
    single = row["batch"] == 1
    if row["op"] == "is_exist" or (single and row["size"] <= 4096):
        return "p50 µs", "p50_us", False
    if row["op"] == "batch_is_exist":
        return "keys/s", "ops_per_s", True
    if row["size"] <= 4096:
        return "items/s", "ops_per_s", True
    return "GB/s", "gbps", True


def fmt(v: float, key: str) -> str:
    if key == "gbps":
        return f"{v:.2f}"
    if key == "p50_us":
        return f"{v:.0f}"
    return f"{v:,.0f}"


def merge(mc: dict, rg: dict, ceilings: dict, a) -> dict:
    idx = {(r["mode"], r["size"], r["op"]): r for r in mc["rows"]}
    rows = []
    for r in rg["rows"]:
        m = idx.get((r["mode"], r["size"], r["op"]))
        if m is None:
            continue
        label, key, higher = figure(r)
        mv, rv = m[key], r[key]
        if higher:
            speed = rv / mv if mv else None
        else:
            speed = mv / rv if rv else None
        rows.append({
            "mode": r["mode"], "size": r["size"], "op": r["op"], "batch": r["batch"],
            "figure": label, "mooncake": mv, "regolith": rv,
            "regolith_speedup": speed,
            "detail": {"mooncake": m, "regolith": r},
        })  # fmt: skip
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": a.command,
        "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "versions": {"mooncake": mc["version"], "regolith": rg["version"],
                     "regolith_commit": a.commit},  # fmt: skip
        "duration_s_per_row": a.duration,
        "ceilings": ceilings,
        "rows": rows,
        "errors": {"mooncake": sum(r["errors"] for r in mc["rows"]),
                   "regolith": sum(r["errors"] for r in rg["rows"])},  # fmt: skip
    }


def table(rep: dict) -> str:
    c = rep["ceilings"]
    out = [
        f"vs-mooncake, {rep['date']}: Mooncake {rep['versions']['mooncake']}, Regolith "
        f"{rep['versions']['regolith']} ({rep['versions']['regolith_commit'] or '?'}), "
        f"{rep['duration_s_per_row']} s per row",
        f"ceilings: memcpy {c['memcpy_gbps']:.2f} GB/s, one loopback TCP stream "
        f"{c['tcp_gbps']:.2f} GB/s, TCP round trip p50 {c['tcp_rtt_us']:.0f} µs",
        "",
        "| mode | size | op | batch | figure | Mooncake | Regolith | Regolith speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["rows"]:
        key = {"p50 µs": "p50_us", "GB/s": "gbps"}.get(r["figure"], "ops_per_s")
        sp = "–" if r["regolith_speedup"] is None else f"{r['regolith_speedup']:.2f}×"
        errs = [s for s in ("mooncake", "regolith") if r["detail"][s]["errors"]]
        note = f" (errors: {', '.join(errs)})" if errs else ""
        out.append(
            f"| {r['mode']} | {human(r['size'])} | {r['op']} | {r['batch']} | {r['figure']} | "
            f"{fmt(r['mooncake'], key)} | {fmt(r['regolith'], key)} | {sp}{note} |"
        )
    out += ["", "speed-up: Regolith ÷ Mooncake for rates, Mooncake ÷ Regolith for latency "
            "(above 1: Regolith is faster)", "",
            "| mode | size | op | batch | Mooncake ops/s | GB/s | p50 µs | p99 µs | err "
            "| Regolith ops/s | GB/s | p50 µs | p99 µs | err |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rep["rows"]:
        cells = []
        for s in ("mooncake", "regolith"):
            d = r["detail"][s]
            cells += [f"{d['ops_per_s']:,.0f}", f"{d['gbps']:.2f}", f"{d['p50_us']:.0f}",
                      f"{d['p99_us']:.0f}", str(d["errors"])]  # fmt: skip
        out.append(f"| {r['mode']} | {human(r['size'])} | {r['op']} | {r['batch']} | "
                   + " | ".join(cells) + " |")  # fmt: skip
    e = rep["errors"]
    out += ["", f"errors: Mooncake {e['mooncake']}, Regolith {e['regolith']}"]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", type=Path, required=True, help="CARGO_TARGET_DIR (release/)")
    p.add_argument("--mooncake-venv", type=Path, required=True)
    p.add_argument("--regolith-venv", type=Path, required=True)
    p.add_argument("--logdir", type=Path, required=True)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--filter", default="")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-index", action="store_true",
                   help="Regolith's sidecars without their object index (regolith up --no-index)")
    p.add_argument("--commit", default="")
    p.add_argument("--command", default="")
    a = p.parse_args()
    a.logdir.mkdir(parents=True, exist_ok=True)
    log(f"logs in {a.logdir}")
    mc = run_mooncake(a)
    rg, ceilings = run_regolith(a)
    rep = merge(mc, rg, ceilings, a)
    (a.logdir / "report.json").write_text(json.dumps(rep, indent=1))
    text = table(rep)
    (a.logdir / "report.md").write_text(text + "\n")
    if a.json:
        print(text, file=sys.stderr)
        print(json.dumps(rep))
    else:
        print(text)
    return 1 if any(rep["errors"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
