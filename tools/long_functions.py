#!/usr/bin/env python3
"""Lists files over a line limit and function bodies over a line limit in the library's layers.

    tools/long_functions.py [--file-limit 800] [--function-limit 150] [DIR ...]

A function is a brace block opened on a line that looks like a definition (a parameter list
followed by '{', outside any other function); its length runs from that line to the matching
'}'. Braces in strings and comments are ignored. Good enough to keep the house honest, not a parser.
"""
import argparse
import pathlib
import re
import sys

DEF = re.compile(r"^\s*(?:template\s*<.*>\s*)?[\w:<>,&*\s~\[\]]+\([^;]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:->\s*[\w:<>&*\s]+)?(?::[^;{]*)?\{\s*(?://.*)?$")
NOT_DEF = re.compile(r"^\s*(?:if|for|while|switch|catch|return|else|do|namespace|struct|class|enum|union)\b")


def strip(line):
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


def functions(path):
    lines = path.read_text(errors="replace").splitlines()
    depth, start, start_depth, name = 0, None, 0, ""
    in_block_comment = False
    for i, raw in enumerate(lines):
        line = raw
        if in_block_comment:
            if "*/" not in line:
                continue
            line = line.split("*/", 1)[1]
            in_block_comment = False
        if "/*" in line and "*/" not in line:
            in_block_comment = True
            line = line.split("/*", 1)[0]
        code = strip(line)
        if start is None and DEF.match(code) and not NOT_DEF.match(code):
            start, start_depth, name = i, depth, raw.strip()[:90]
        depth += code.count("{") - code.count("}")
        if start is not None and depth <= start_depth:
            yield name, start + 1, i - start + 1
            start = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-limit", type=int, default=800)
    ap.add_argument("--function-limit", type=int, default=150)
    ap.add_argument("dirs", nargs="*", default=["dsl", "jit", "runtime", "kernels", "api"])
    a = ap.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    over = 0
    for d in a.dirs:
        for p in sorted((root / d).rglob("*")):
            if p.suffix not in (".cpp", ".hpp"):
                continue
            n = len(p.read_text(errors="replace").splitlines())
            rel = p.relative_to(root)
            if n > a.file_limit:
                print(f"file {rel}: {n} lines")
                over += 1
            for name, line, length in functions(p):
                if length > a.function_limit:
                    print(f"function {rel}:{line}: {length} lines: {name}")
                    over += 1
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
