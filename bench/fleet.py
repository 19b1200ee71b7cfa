#!/usr/bin/env python3
"""Issue 29's fleet measurements, on one machine, with a real etcd:

  propagation  time from a write to etcd until the last of N Weir instances serves it
               (p50 / p99 / max over R changes; each instance polled over HTTP)
  large        an instance idle-watching a configuration of K routes: resident memory and
               CPU per minute; then the CPU and time one changed route costs each instance

Usage: bench/fleet.py [--weir target/release/weir] [--instances 10] [--changes 100]
                      [--routes 10000] [--idle 30] [--members 1]
Needs etcd and etcdctl (Debian etcd-server, etcd-client) and python3; nothing else.
Writes go to etcd's JSON gateway (the v3 HTTP API) so the clock starts as the put is sent.
"""

import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PREFIX = "/weir/bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member (or `n` on one machine) in a temporary directory."""

    def __init__(self, directory, members):
        self.procs = []
        names = [f"m{i}" for i in range(members)]
        peers = [free_port() for _ in names]
        self.clients = [free_port() for _ in names]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peers))
        for n, peer, client in zip(names, peers, self.clients):
            self.procs.append(subprocess.Popen(
                ["etcd", "--name", n, "--data-dir", os.path.join(directory, n),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--logger", "zap", "--log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.endpoints = [f"http://127.0.0.1:{c}" for c in self.clients]
        deadline = time.time() + 20
        while True:
            try:
                self.put("/weir/bench-ping", "1")
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("fleet.py: etcd did not start")
                time.sleep(0.05)

    def put(self, key, value):
        """A put through the JSON gateway; returns the revision it made."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                           "value": base64.b64encode(value.encode()).decode()}).encode()
        req = urllib.request.Request(self.endpoints[0] + "/v3/kv/put", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(json.load(r)["header"]["revision"])

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def route_value(body):
    return f'path_prefix = "/"\nrespond = {{ status = 200, body = "{body}" }}\n'


def fleet_toml(routes):
    """The shared objects: listener `web` (each instance binds its own port) and its routes."""
    out = ['[[listeners]]\nname = "web"\nbind = "127.0.0.1:1"\n']
    out.append('\n[[listeners.routes]]\nname = "v"\npath_prefix = "/"\n'
               'respond = { status = 200, body = "v0" }\n')
    for i in range(routes):
        out.append(f'\n[[listeners.routes]]\nname = "r{i}"\npath_prefix = "/r{i}/"\n'
                   f'respond = {{ status = 200, body = "r{i}" }}\n')
    return "".join(out)


def local_toml(directory, node, endpoints, admin, port):
    eps = ", ".join(f'"{e}"' for e in endpoints)
    return (f'[server]\nworkers = 1\ndrain_timeout = "0s"\n\n[admin]\nbind = "127.0.0.1:{admin}"\n\n'
            f'[cluster]\nnode = "{node}"\nbinds = {{ web = "127.0.0.1:{port}" }}\n\n'
            f'[cluster.etcd]\nendpoints = [{eps}]\nprefix = "{PREFIX}"\n'
            f'snapshot = "{directory}/{node}.snapshot.json"\n')


class Instance:
    def __init__(self, weir, directory, i, endpoints):
        self.node = f"n{i}"
        self.port = free_port()
        path = os.path.join(directory, f"{self.node}.toml")
        with open(path, "w") as f:
            f.write(local_toml(directory, self.node, endpoints, free_port(), self.port))
        self.config = path
        self.log = open(os.path.join(directory, f"{self.node}.log"), "w")
        self.proc = subprocess.Popen([weir, "run", "-c", path], stdout=self.log, stderr=self.log)
        self.conn = None

    def get(self, path):
        """GET over one kept-alive connection; the body, or None while nothing answers."""
        for _ in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                self.conn.request("GET", path)
                r = self.conn.getresponse()
                return r.read().decode(errors="replace")
            except (OSError, http.client.HTTPException):
                self.conn = None
        return None

    def wait_for(self, path, body, deadline):
        while time.time() < deadline:
            if self.get(path) == body:
                return time.time()
            time.sleep(0.0005)
        return None

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def all_serve(instances, path, body, timeout):
    """Polls every instance at once; the time each first served `body` (None: never)."""
    deadline = time.time() + timeout
    seen = [None] * len(instances)

    def poll(i):
        seen[i] = instances[i].wait_for(path, body, deadline)

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(len(instances))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def push(weir, instance, directory, routes):
    path = os.path.join(directory, f"fleet-{routes}.toml")
    with open(path, "w") as f:
        f.write(fleet_toml(routes))
    started = time.time()
    subprocess.run([weir, "ctl", "-c", instance.config, "cluster", "push", "-f", path],
                   check=True, stdout=subprocess.DEVNULL)
    return time.time() - started


def propagation(etcd, instances, changes):
    """Per change: the time from the put to the last instance serving it."""
    lasts, firsts = [], []
    for n in range(1, changes + 1):
        body = f"v{n}"
        sent = time.time()
        etcd.put(f"{PREFIX}/config/routes/web/v", route_value(body))
        seen = all_serve(instances, "/", body, 10)
        if None in seen:
            sys.exit(f"fleet.py: change {n} not served by every instance within 10 s")
        lasts.append(max(seen) - sent)
        firsts.append(min(seen) - sent)
    ms = lambda v: f"{v * 1000:.1f} ms"
    print(f"propagation to {len(instances)} instances, {changes} changes: last instance "
          f"p50 {ms(pct(lasts, 50))}, p99 {ms(pct(lasts, 99))}, max {ms(max(lasts))}; "
          f"first instance p50 {ms(pct(firsts, 50))}")


def perf_record(inst, variable):
    """`perf record` of the instance into the file the environment variable names, if set:
    where its CPU goes (FLEET_PERF_GRAPH: perf's --call-graph, such as dwarf,8192)."""
    out = os.environ.get(variable)
    if not out:
        return None
    graph = os.environ.get("FLEET_PERF_GRAPH", "fp")
    return subprocess.Popen(["perf", "record", "-q", "--call-graph", graph, "-o", out,
                             "-p", str(inst.proc.pid)], stdout=subprocess.DEVNULL)


def perf_stop(profile):
    if profile:
        profile.send_signal(2)
        profile.wait()


def large(weir, etcd, directory, routes, idle):
    """One instance with `routes` routes: memory, idle CPU, and one change's cost."""
    inst = Instance(weir, directory, 100, etcd.endpoints)
    try:
        took = push(weir, inst, directory, routes)
        last = f"/r{routes - 1}/"
        started = time.time()
        if all_serve([inst], last, f"r{routes - 1}", 120)[0] is None:
            sys.exit("fleet.py: the large configuration was not served within 120 s")
        print(f"{routes} routes: push {took:.1f} s, served {time.time() - started:.1f} s later")
        time.sleep(2)
        idle_profile = perf_record(inst, "FLEET_PERF_IDLE")
        cpu0, rss = inst.cpu_seconds(), inst.rss_mib()
        time.sleep(idle)
        cpu1 = inst.cpu_seconds()
        perf_stop(idle_profile)
        print(f"{routes} routes idle: RSS {rss:.0f} MiB, CPU {(cpu1 - cpu0) / idle * 60:.2f} s per minute "
              f"({idle} s measured)")
        costs, times = [], []
        profile = perf_record(inst, "FLEET_PERF")
        for n in range(1, 6):
            body = f"x{n}"
            before = inst.cpu_seconds()
            sent = time.time()
            etcd.put(f"{PREFIX}/config/routes/web/r0", f'path_prefix = "/r0/"\nrespond = {{ status = 200, body = "{body}" }}\n')
            done = all_serve([inst], "/r0/", body, 30)[0]
            if done is None:
                sys.exit("fleet.py: a change to the large configuration was not served within 30 s")
            times.append(done - sent)
            time.sleep(1)  # let the apply's tail (snapshot write) finish before reading CPU
            costs.append(inst.cpu_seconds() - before)
        perf_stop(profile)
        print(f"one changed route in {routes}: served after p50 {pct(times, 50) * 1000:.0f} ms "
              f"(max {max(times) * 1000:.0f} ms), CPU {pct(costs, 50) * 1000:.0f} ms per change "
              f"(incl. 1 s idle), RSS after {inst.rss_mib():.0f} MiB")
    finally:
        inst.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weir", default="target/release/weir")
    ap.add_argument("--instances", type=int, default=10)
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--routes", type=int, default=10000)
    ap.add_argument("--idle", type=int, default=30)
    ap.add_argument("--members", type=int, default=1)
    a = ap.parse_args()
    weir = os.path.realpath(a.weir)
    for tool in ("etcd", "etcdctl"):
        if shutil.which(tool) is None:
            sys.exit(f"fleet.py: {tool} not found (Debian etcd-server / etcd-client)")
    directory = tempfile.mkdtemp(prefix="weir-fleet-")
    etcd = Etcd(directory, a.members)
    instances = []
    try:
        instances = [Instance(weir, directory, i, etcd.endpoints) for i in range(a.instances)]
        push(weir, instances[0], directory, 0)
        if None in all_serve(instances, "/", "v0", 30):
            sys.exit(f"fleet.py: not every instance came up; logs in {directory}")
        if a.changes:
            propagation(etcd, instances, a.changes)
        for i in instances:
            i.stop()
        instances = []
        if a.routes:
            large(weir, etcd, directory, a.routes, a.idle)
    finally:
        for i in instances:
            i.stop()
        etcd.stop()
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
