#!/usr/bin/env python3
"""Peak memory of one request against its body size: a fresh `baton serve`
(stories260K) on loopback per row gets one JSON body of a hostile shape up to
the body limit, after one small warm-up request; the server's peak RSS is
reset just before (/proc/PID/clear_refs), and the row is its peak during the
request minus its RSS before. Prints a Markdown
table (docs/RELIABILITY.md). Linux only; talks to 127.0.0.1 only.

  tests/reliability/json_memory.py --baton build/baton [--model FILE]
"""
import argparse
import os
import socket

from serve_process import ServeProcess

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def shapes():
    head = b'{"model":"stories260K","prompt":"Once","max_tokens":1,"x":'
    out = [(f"'[' only, {mb} MiB", b"[" * (mb * MiB - 1024)) for mb in (1, 2, 4)]
    size = 4 * MiB - 1024
    out.append(("a 1,000,000-level array in an unknown field", head + b"[" * 1000000 + b"]" * 1000000 + b"}"))
    zeros = (size - len(head) - 2) // 2
    out.append(("a flat array of 0s in an unknown field", head + b"[" + b"0," * (zeros - 1) + b"0]}"))
    keys = (size - len(head) - 2) // 12
    out.append(("an object of short keys in an unknown field",
                head + b"{" + b",".join(b'"%07d":0' % i for i in range(keys)) + b"}}"))
    out.append(("one string in an unknown field", head + b'"' + b"a" * (size - len(head) - 3) + b'"}'))
    return out


class Server(ServeProcess):
    def status_field(self, name):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def post(self, body):
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
        s.close()
        return int(out[9:12]) if out else 0

    def peak(self, body):
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")
        before = self.status_field("VmRSS")
        status = self.post(body)
        return status, self.status_field("VmHWM") - before



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baton", required=True)
    ap.add_argument("--model", default=os.path.join(HERE, "../../../shared/models/stories260K.gguf"))
    args = ap.parse_args()
    print("| body | size | status | peak over the resting RSS |")
    print("|---|---|---|---|")
    for name, body in shapes():
        server = Server(args.baton, args.model)
        try:
            server.post(b'{"model":"stories260K","prompt":"Once","max_tokens":1}')
            status, peak = server.peak(body)
            print(f"| {name} | {len(body) / MiB:.2f} MiB | {status} | {peak / MiB:.1f} MiB |")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
