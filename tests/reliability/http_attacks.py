#!/usr/bin/env python3
"""The HTTP attacks of docs/RELIABILITY.md ("Attacks, second round: the HTTP
server") against `baton serve` (stories260K) on loopback, with figures:

  pipelining   two GET /health in one packet, N tries; a completion followed
               50 ms later by GET /health on the same connection, streamed and
               not; answered in order or not
  leaving      ten connections that pipeline a long completion and a request,
               then close: slots busy afterwards, generations cancelled
  counting     sequential requests whose client resets the connection as soon
               as it has the answer: requests counted in /metrics
  hog          one address holding 256 idle sockets, renewed every 10 s, while
               a normal client sends a request every 50 ms: its success rate

Prints one line per figure; exit status 0 (the CI tests assert, this measures).
Talks to 127.0.0.1 only (127.0.0.2 for the hog); bounded in time.

  tests/reliability/http_attacks.py --baton build/baton [--seconds 30] [--tries 1000]
"""
import argparse
import json
import os
import re
import socket
import struct
import threading
import time

from serve_process import ServeProcess

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0,
        "logit_bias": {"2": -100}}


class Server(ServeProcess):
    def __init__(self, baton, model, extra=()):
        super().__init__(baton, model, ("--ctx", "2048", *extra))


def connect(port, source="127.0.0.1", timeout=10):
    s = socket.socket()
    s.settimeout(timeout)
    if source != "127.0.0.1":
        s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def post_text(body, close=False):
    b = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
            (b"Connection: close\r\n" if close else b"") + b"Content-Length: %d\r\n\r\n" % len(b) + b)


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
GET_HEALTH_CLOSE = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def read_until_close(s):
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    return out


def statuses(raw):
    return [int(m.group(1)) for m in re.finditer(rb"HTTP/1\.1 (\d{3}) ", raw)]


def metrics(port):
    s = connect(port)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = read_until_close(s).decode(errors="replace")
    s.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("baton_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def pipelining(srv, tries):
    both = 0
    for _ in range(tries):
        s = connect(srv.port)
        s.sendall(GET_HEALTH + GET_HEALTH_CLOSE)
        both += statuses(read_until_close(s)) == [200, 200]
        s.close()
    print(f"pipelining: two GET /health in one packet: {both} / {tries} answered in order")
    for stream in (False, True):
        ok = 0
        n = 20
        for _ in range(n):
            s = connect(srv.port, timeout=30)
            s.sendall(post_text(dict(LONG, max_tokens=300, stream=stream)))
            time.sleep(0.05)
            s.sendall(GET_HEALTH_CLOSE)
            raw = read_until_close(s)
            ok += statuses(raw) == [200, 200] and (not stream or b"data: [DONE]" in raw)
            s.close()
        print(f"pipelining: completion ({'streamed' if stream else 'whole'}, 300 tokens) then GET /health 50 ms "
              f"later: {ok} / {n} answered in order")


def leaving(srv):
    before = metrics(srv.port)
    socks = []
    for i in range(10):
        s = connect(srv.port)
        s.sendall(post_text(dict(LONG, stream=bool(i % 2))))
        socks.append(s)
    time.sleep(0.05)
    for s in socks:
        s.sendall(GET_HEALTH_CLOSE)
    time.sleep(0.2)
    for s in socks:
        s.close()
    time.sleep(2)
    m = metrics(srv.port)
    cancelled = m.get('baton_generations_total{finish="cancelled"}', 0) - before.get(
        'baton_generations_total{finish="cancelled"}', 0)
    print(f"leaving: 10 pipelining clients gone; 2 s later slots busy {m['baton_slots_busy']:.0f}, queued "
          f"{m['baton_queue_depth']:.0f}, generations cancelled {cancelled:.0f}")


def counted(m):
    return sum(v for k, v in m.items() if k.startswith("baton_http_responses_total{") and 'endpoint="metrics"' not in k)


def counting(srv, tries):
    before = counted(metrics(srv.port))
    for _ in range(tries):
        s = connect(srv.port)
        s.sendall(GET_HEALTH)
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw) < raw.index(b"\r\n\r\n") + 4 + int(
                re.search(rb"Content-Length: (\d+)", raw).group(1)):
            raw += s.recv(65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    time.sleep(0.5)
    print(f"counting: {tries} requests reset as soon as answered: {counted(metrics(srv.port)) - before:.0f} counted")


def hog(srv, seconds):
    stop = threading.Event()

    def hold():
        while not stop.is_set():
            socks = []
            for _ in range(256):
                try:
                    socks.append(connect(srv.port, "127.0.0.2", timeout=1))
                except OSError:
                    pass
            stop.wait(10)
            for s in socks:
                s.close()

    t = threading.Thread(target=hold)
    t.start()
    time.sleep(1)
    ok = n = 0
    end = time.time() + seconds
    while time.time() < end:
        n += 1
        try:
            s = connect(srv.port, timeout=5)
            s.sendall(post_text({"model": "stories260K", "prompt": "Once", "max_tokens": 2}, close=True))
            ok += statuses(read_until_close(s))[:1] == [200]
            s.close()
        except OSError:
            pass
        time.sleep(0.05)
    stop.set()
    t.join()
    print(f"hog: 256 idle sockets from one address, renewed every 10 s, {seconds} s: a normal client's "
          f"success rate {ok} / {n} ({100.0 * ok / max(n, 1):.1f}%)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baton", required=True)
    ap.add_argument("--model", default=os.path.join(HERE, "../../../shared/models/stories260K.gguf"))
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--tries", type=int, default=1000)
    args = ap.parse_args()
    for step in (lambda s: pipelining(s, args.tries), leaving, lambda s: counting(s, args.tries),
                 lambda s: hog(s, args.seconds)):
        srv = Server(args.baton, args.model, ("--parallel", "4", "--queue", "64"))
        try:
            step(srv)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
