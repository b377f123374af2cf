"""Reference chat-template rendering with Python's jinja2, set up as Hugging Face's apply_chat_template does
(sandboxed, trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now), for compute/tests/tokenizer.rs.

Reads JSON from stdin: [{"template": str, "bos": str, "eos": str, "messages": [[role, content], ...],
"add_generation_prompt": bool}, ...]. Prints a JSON list: the rendered text, or {"error": message} where rendering failed.
"""

import json
import sys
from datetime import datetime

import jinja2
import jinja2.sandbox


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = []
    for case in json.load(sys.stdin):
        try:
            t = env.from_string(case["template"])
            msgs = [{"role": r, "content": c} for r, c in case["messages"]]
            out.append(
                t.render(
                    messages=msgs,
                    add_generation_prompt=case["add_generation_prompt"],
                    bos_token=case["bos"],
                    eos_token=case["eos"],
                )
            )
        except Exception as e:  # noqa: BLE001 - any failure is reported to the test
            out.append({"error": str(e)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
