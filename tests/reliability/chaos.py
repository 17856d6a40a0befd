#!/usr/bin/env python3
"""Chaos run of a local pipeline: `baton serve --workers 3` on loopback while
clients keep sending requests and workers are killed (SIGKILL), stalled
(SIGSTOP, then SIGCONT unless the coordinator killed it first) and cut in the middle of a long prefill (SIGKILL while
activations of a long prompt are on the wire).

Every request must either complete correctly (200 with a finish reason; a
stream ending in [DONE]) or fail with a clear error (a 5xx JSON error, or a
stream's error chunk naming what failed) -- never hang (client timeout) and
never end silently. After the chaos stops, the route must heal and every one
of the recovery requests must succeed. Prints a table; exit status 1 on any
failure. Bounded in time; talks to 127.0.0.1 only.

  tests/reliability/chaos.py --baton build/baton [--seconds 60] [--clients 6] [--seed 1]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "..", "..", "shared", "models", "stories260K.gguf")
LONG_PROMPT = " ".join(["Once upon a time there was a little girl who liked to play."] * 20)


class Server:
    def __init__(self, args):
        self.err = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        cmd = [args.baton, "serve", "-m", args.model, "--workers", str(args.workers), "--parallel", "8",
               "--queue", "64", "--ctx", "1024", "--batch", "16", "--worker-delay-ms", "2", "--port", "0",
               "--threads", str(args.workers), "--quiet"]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.p.stdout.readline()
            if not line:
                break
            m = re.match(r"baton serve: listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "baton serve: ready" in line:
                return
        sys.exit("baton serve did not start:\n" + self.log()[-3000:])

    def log(self):
        with open(self.err.name) as f:
            return f.read()

    def worker_pids(self):
        latest = {}
        for name, pid in re.findall(r"baton: started (worker-\d+) \(pid (\d+)\)", self.log()):
            latest[name] = int(pid)
        return latest

    def health(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read() or b"{}")
        except Exception:
            return {}

    def wait_ok(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.health().get("status") == "ok":
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -1


def request(port, rng, model, timeout):
    """one request; returns 'ok', 'error' (clear) or 'fail: why'"""
    stream = rng.random() < 0.5
    body = {"model": model, "prompt": LONG_PROMPT if rng.random() < 0.3 else "Once upon a time",
            "max_tokens": rng.randint(8, 64), "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 99),
            "stream": stream}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read())["error"]["message"]
        except Exception:
            return f"fail: HTTP {e.code} without an OpenAI error body"
        return "error" if e.code in (500, 503) and msg else f"fail: HTTP {e.code}: {msg}"
    except TimeoutError:
        return "fail: hang (no answer within the client timeout)"
    except Exception as e:  # reset without a response
        if "timed out" in str(e):
            return "fail: hang (no answer within the client timeout)"
        return f"fail: {type(e).__name__}: {e}"
    if not stream:
        try:
            j = json.loads(text)
        except ValueError:
            return "fail: truncated JSON body"
        return "ok" if j["choices"][0]["finish_reason"] in ("stop", "length") else "fail: no finish reason"
    events = [l[6:] for l in text.split("\n") if l.startswith("data: ")]
    if not events:
        return "fail: empty stream"
    try:
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
    except ValueError:
        return "fail: stream cut inside a chunk"
    if any("error" in c for c in chunks):
        return "error" if all(c["error"].get("message") for c in chunks if "error" in c) else "fail: empty error"
    if events[-1] != "[DONE]":
        return "fail: stream ended without [DONE] or an error"
    finished = any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks)
    return "ok" if finished else "fail: [DONE] without a finish reason"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baton", required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--recovery-requests", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    srv = Server(args)
    model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/v1/models").read())["data"][0]["id"]
    counts = {"ok": 0, "error": 0}
    failures = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i):
        rng = random.Random(args.seed * 1000 + i)
        while not stop.is_set():
            out = request(srv.port, rng, model, timeout=30)
            with lock:
                if out.startswith("fail"):
                    failures.append(out)
                else:
                    counts[out] += 1
            if out != "ok":
                time.sleep(0.2)  # a client backs off after an error

    actions = {"kill": 0, "stall": 0, "cut in prefill": 0}
    heal_times = []

    def chaos():
        rng = random.Random(args.seed)
        while not stop.is_set():
            time.sleep(rng.uniform(2, 4))
            if stop.is_set():
                break
            pids = srv.worker_pids()
            name = rng.choice(sorted(pids))
            pid = pids[name]
            kind = rng.choice(list(actions))
            try:
                if kind == "kill":
                    os.kill(pid, signal.SIGKILL)
                elif kind == "stall":
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(rng.uniform(1.8, 3.0))
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass  # the coordinator killed it once its link timed out
                else:
                    # A long prompt goes through the stages in chunks; kill a
                    # stage while they are on the wire.
                    threading.Thread(target=request, args=(srv.port, random.Random(0), model, 30), daemon=True).start()
                    time.sleep(0.05)
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            actions[kind] += 1
            t0 = time.time()
            # The break is noticed within the link timeout (1.5 s); then heal.
            while time.time() - t0 < 3 and srv.health().get("status") == "ok":
                time.sleep(0.05)
            if not srv.wait_ok(90):
                failures.append(f"fail: the route did not heal within 90 s after {kind} of {name}")
                return
            heal_times.append(time.time() - t0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=chaos))
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    healed = srv.wait_ok(90)
    rng = random.Random(args.seed + 1)
    recovered = sum(request(srv.port, rng, model, timeout=30) == "ok" for _ in range(args.recovery_requests)) if healed else 0
    code = srv.stop()
    print(f"| actions | kill {actions['kill']}, stall {actions['stall']}, cut in prefill {actions['cut in prefill']} |")
    print(f"| requests during chaos | {counts['ok']} completed, {counts['error']} failed with a clear error, "
          f"{len(failures)} failed otherwise |")
    if heal_times:
        print(f"| time to heal | median {sorted(heal_times)[len(heal_times) // 2]:.1f} s, max {max(heal_times):.1f} s |")
    print(f"| after recovery | {recovered} / {args.recovery_requests} requests succeeded |")
    print(f"| server exit status | {code} |")
    for f in failures[:10]:
        print("  ", f)
    ok = not failures and healed and recovered == args.recovery_requests and code == 0
    print("chaos: PASS" if ok else "chaos: FAIL")
    if not ok:
        print(srv.log()[-3000:])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
