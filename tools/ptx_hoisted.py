#!/usr/bin/env python3
"""Values a PTX kernel computes outside a loop and uses inside it (registers held through the loop).

LLVM hoists loop-invariant arithmetic (a store's staging offsets, the wgmma descriptors of tiles
loaded once) out of loops; each such value then holds a register through every iteration, and a
kernel near its register cap spills or schedules worse (decisions 076, 077). For the largest loops
(by PTX lines) this prints how many values come from outside and the instructions that made them.

  tools/ptx_hoisted.py KERNEL.ptx [--loops N] [--through]   (e.g. from `tilejit compile ... --emit ptx -o DIR`)

--through also counts, per loop, the values defined before it and used only after it: registers
held through the loop for an epilogue (decision 080: an element-store fallback's column offsets and
tensor strides kept ~60 registers live through the dK/dV kernel's query loop).
"""
import argparse
import collections
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ptx")
    ap.add_argument("--loops", type=int, default=3, help="how many of the largest loops to report")
    ap.add_argument("--through", action="store_true", help="also the values live through each loop, unused inside it")
    args = ap.parse_args()
    lines = open(args.ptx).read().split("\n")
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__BB\d+_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    # a loop: a branch back to an earlier label (its body: the lines between)
    loops = set()
    for i, line in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if m and labels.get(m.group(1), len(lines)) < i:
            loops.add((labels[m.group(1)], i))
    defs = collections.defaultdict(list)  # register -> [(line, opcode)]
    uses = collections.defaultdict(list)  # register -> [line] (operands, not the defined register)
    for i, line in enumerate(lines):
        m = re.match(r"(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s+(%[a-z]+\d+)", line.strip())
        regs = re.findall(r"%[a-z]+\d+", line)
        if m:
            defs[m.group(2)].append((i, m.group(1)))
            regs = regs[1:] if regs and regs[0] == m.group(2) else regs
        for r in regs:
            uses[r].append(i)
    if not loops:
        print("no loops")
        return 0
    for first, last in sorted(loops, key=lambda l: l[0] - l[1])[: args.loops]:
        used = {r for i in range(first, last + 1) for r in re.findall(r"%[a-z]+\d+", lines[i])}
        outside = [(r, d[0][1]) for r in used for d in [defs.get(r, [])] if d and all(i < first or i > last for i, _ in d)]
        wide = sum(1 for r, _ in outside if r.startswith("%rd") or r.startswith("%fd"))
        ops = collections.Counter(op for _, op in outside)
        print(f"loop at PTX lines {first}-{last} ({last - first} lines): {len(outside)} values from outside "
              f"({wide} of them 64-bit: two registers each); made by {', '.join(f'{op} {n}' for op, n in ops.most_common(12))}")
        if args.through:
            through = [(r, d[0][1]) for r, d in defs.items()
                       if all(i < first for i, _ in d) and any(u > last for u in uses[r]) and not any(first <= u <= last for u in uses[r])]
            ops = collections.Counter(op for _, op in through)
            print(f"  live through it, unused inside: {len(through)} values; made by "
                  f"{', '.join(f'{op} {n}' for op, n in ops.most_common(12))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
