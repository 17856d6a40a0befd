#!/usr/bin/env python3
"""Renders chat templates with Jinja2 the way Hugging Face transformers does.

The reference for Baton's Jinja engine (test_chat_jinja): every template is
rendered for every case of a conversations file, and the outputs (or the fact
that Jinja2 raised) are written as JSON.

Environment, as transformers' chat template utilities build it: an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and the `{% generation %}` block (rendered unchanged
when no assistant mask is asked for); tojson replaced by json.dumps with
ensure_ascii=False (and its indent / separators / sort_keys arguments);
raise_exception and strftime_now as globals. strftime_now reads a fixed clock
(the `now` of the conversations file, local time) so outputs are stable.

usage: render_oracle.py TEMPLATE_DIR CONVERSATIONS_JSON OUT_JSON
       render_oracle.py --snippets SNIPPETS_JSON OUT_JSON
The second form renders small inline templates, each with its own context.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_one(env, source, context):
    try:
        template = env.from_string(source)
    except Exception as e:
        return {"load_error": f"{type(e).__name__}: {e}"}
    try:
        return {"output": template.render(**context)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def snippets(spec_path, out_path):
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    env = make_env(spec["now"])
    results = {s["name"]: render_one(env, s["template"], s["context"]) for s in spec["snippets"]}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)


def main():
    if sys.argv[1] == "--snippets":
        return snippets(sys.argv[2], sys.argv[3])
    template_dir, conv_path, out_path = sys.argv[1:4]
    with open(conv_path, encoding="utf-8") as f:
        spec = json.load(f)
    env = make_env(spec["now"])
    results = {}
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8") as f:
            source = f.read()
        entry = results.setdefault(name, {})
        try:
            template = env.from_string(source)
        except Exception as e:  # a template Jinja2 cannot load
            entry["load_error"] = f"{type(e).__name__}: {e}"
            continue
        for case in spec["cases"]:
            try:
                entry[case["name"]] = {"output": template.render(**case["context"])}
            except Exception as e:
                entry[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
