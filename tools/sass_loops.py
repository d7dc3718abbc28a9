#!/usr/bin/env python3
"""Loops of a kernel's SASS and the opcode histogram of one: how the decision records (docs/decisions/) count "main-loop SASS".

A loop is a backward branch and the instructions from its target up to it (the branch itself not
counted). Reads `cuobjdump -sass` text on stdin -- e.g. `tilejit inspect KERNEL ... --pass verify`,
whose SASS section it finds -- and prints every loop of 20 or more instructions, largest first,
then the histogram of the main loop: the largest one closed by a predicated branch that is not
`.ANY` (an unconditional branch back is an out-of-line mbarrier retry path; `BRA.U.ANY` loops are
elect/spin loops). With nested loops (dK/dV: query blocks inside GQA heads) pass --loop N.

  build/tools/tilejit inspect attention_fwd --meta HEAD_DIM=128 --pass verify | tools/sass_loops.py
"""
import collections
import re
import sys


def main():
    lines = sys.stdin.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('==== SASS')), 0)
    insts, labels, pending = [], {}, []  # (address, text); label -> address
    for l in lines[start:]:
        m = re.match(r'\s*(\.L_x_\d+):', l)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
        if m:
            address = int(m.group(1), 16)
            labels.update({p: address for p in pending})
            pending = []
            insts.append((address, m.group(2).strip()))
    loops = []  # (size, target, branch address, branch text, body)
    for address, text in insts:
        m = re.search(r'BRA(?:\.\S+)?\s+(?:.*,\s*)?(?:`\((\.L_x_\d+)\)|0x([0-9a-f]+))\s*$', text)
        if not m:
            continue
        target = labels.get(m.group(1)) if m.group(1) else int(m.group(2), 16)
        if target is not None and target < address:
            body = [x for x in insts if target <= x[0] < address]
            loops.append((len(body), target, address, text, body))
    loops.sort(key=lambda x: -x[0])
    for i, (n, target, address, text, _) in enumerate(loops):
        if n >= 20:
            print(f"loop {i}: {n} instructions, {target:#06x}..{address:#06x}: {text}")
    if not loops:
        return
    main_loops = [i for i, l in enumerate(loops) if l[3].startswith('@') and '.ANY' not in l[3]]
    chosen = int(sys.argv[sys.argv.index('--loop') + 1]) if '--loop' in sys.argv else (main_loops or [0])[0]
    n, _, _, _, body = loops[chosen]
    histogram = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', text).split()[0] for _, text in body)
    print(f"histogram of loop {chosen} ({n}):")
    for opcode, count in histogram.most_common():
        print(f"  {count:5d} {opcode}")


if __name__ == '__main__':
    main()
