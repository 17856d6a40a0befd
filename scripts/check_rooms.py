#!/usr/bin/env python3
"""Checks the rooms of engine/ and chat/ (docs/ARCHITECTURE.md, "The engine's rooms"):

- includes point down the room order below; at most MAX_UPWARD run up it,
  and none between engine/runtime and chat;
- engine/ and chat/ include nothing of the coordinator, the worker, the
  file tools, the wire protocol or the command line;
- no folder holds more than MAX_FILES files, no file more than MAX_LINES
  lines (Unicode tables excepted).

Prints every finding and exits 1 on any. scripts/test.sh runs it.
"""
import os
import re
import sys

# Bottom to top: a room may include the rooms before it.
ROOMS = [
    "engine/base", "engine/gguf", "engine/text", "engine/sampling", "engine/model", "engine/tp",
    "engine/plan", "engine/runtime", "engine/arch", "engine/spec", "engine/dspark", "engine/cuda", "engine/cuda/stages",
    "engine",  # engine/registry.cpp: the list of architectures, above every room
    "chat/jinja", "chat/output", "chat/templates", "chat",
]
MAX_UPWARD = 5
MAX_FILES = 15
MAX_LINES = 800
LINE_EXEMPT = {"engine/text/unicode_tables.cpp"}
OUTSIDE = ("coordinator/", "worker/", "gguf_split/", "net/", "cli/")
SOURCE = (".h", ".cpp", ".cu", ".cuh")

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)
rank = {room: i for i, room in enumerate(ROOMS)}
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
problems = []
upward = []
for top in ("engine", "chat"):
    for folder, _, names in os.walk(top):
        files = sorted(n for n in names if n.endswith(SOURCE))
        if len(files) > MAX_FILES:
            problems.append(f"{folder}/ holds {len(files)} files (at most {MAX_FILES})")
        if files and folder not in rank:
            problems.append(f"{folder}/ is not a room of scripts/check_rooms.py")
            continue
        for name in files:
            path = f"{folder}/{name}"
            text = open(path, encoding="utf-8").read()
            lines = text.count("\n")
            if lines > MAX_LINES and path not in LINE_EXEMPT:
                problems.append(f"{path}: {lines} lines (at most {MAX_LINES})")
            for target in include.findall(text):
                if target.startswith(OUTSIDE):
                    problems.append(f"{path} includes {target}: engine/ and chat/ stand below it")
                    continue
                if not target.startswith(("engine/", "chat/")):
                    continue
                to = os.path.dirname(target)
                if to not in rank:
                    problems.append(f"{path} includes {target}: not in a room")
                elif rank[to] > rank[folder]:
                    pair = {folder, to}
                    if "engine/runtime" in pair and any(r.startswith("chat") for r in pair):
                        problems.append(f"{path} includes {target}: runtime and chat know nothing of each other")
                    upward.append(f"{path} -> {target}")
for line in upward:
    print(f"upward: {line}")
if len(upward) > MAX_UPWARD:
    problems.append(f"{len(upward)} includes run up the rooms (at most {MAX_UPWARD})")
for p in problems:
    print(f"check_rooms: {p}")
print(f"check_rooms: {len(upward)} upward includes (at most {MAX_UPWARD}), {len(problems)} problems")
sys.exit(1 if problems else 0)
