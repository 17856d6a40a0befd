"""`baton serve` of a model on a free loopback port, for the reliability scripts."""
import re
import subprocess


class ServeProcess:
    def __init__(self, baton, model, extra=()):
        self.proc = subprocess.Popen([baton, "serve", "-m", model, "--port", "0", "--threads", "1", "--quiet", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.port = None
        for line in self.proc.stdout:
            m = re.search(r"listening on http://127.0.0.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "ready" in line:
                break

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
