#!/usr/bin/env python3
"""Every cubin of a bundle (.tjb) through nvdisasm: per kernel, what its SASS says at a glance.

A bundle holds the cubins the API launches (`tilejit bundle -o OUT.tjb --attention D=128,...`), so
this checks SASS-level properties of exactly those kernels without a GPU: HGMMA and UTMALDG counts,
CTA barriers, local-memory traffic (spills), and dummy HGMMA groups (`HGMMA.64x8x16.F16 RZ`: ptxas
adds one after a wgmma.commit_group that may run twice, and the next `wgmma.wait_group N` then waits
for one group more -- decision 096). Exits 1 when a kernel has a dummy group.

  tools/bundle_sass.py OUT.tjb [--nvdisasm PATH]     (default: $NVDISASM, else nvdisasm on PATH)

nvdisasm ships with the CUDA toolkit, or in the `nvidia-cuda-nvdisasm` / triton wheels.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def cubins(data):
    """The ELF images in `data`, each cut at the end of its last section or program header."""
    at = 0
    while (at := data.find(b'\x7fELF', at)) >= 0:
        phoff, shoff = struct.unpack_from('<QQ', data, at + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from('<HHHH', data, at + 0x36)
        end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        for k in range(shnum):
            sh = at + shoff + k * shentsize
            kind, = struct.unpack_from('<I', data, sh + 4)
            offset, size = struct.unpack_from('<QQ', data, sh + 0x18)
            if kind != 8:  # SHT_NOBITS takes no file space
                end = max(end, offset + size)
        for k in range(phnum):
            ph = at + phoff + k * phentsize
            offset, = struct.unpack_from('<Q', data, ph + 8)
            filesz, = struct.unpack_from('<Q', data, ph + 0x20)
            end = max(end, offset + filesz)
        yield data[at:at + end]
        at += end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('bundle')
    ap.add_argument('--nvdisasm', default=os.environ.get('NVDISASM') or shutil.which('nvdisasm'))
    args = ap.parse_args()
    if not args.nvdisasm:
        sys.exit('bundle_sass.py: no nvdisasm (pass --nvdisasm PATH or set NVDISASM)')
    data = open(args.bundle, 'rb').read()
    dummies = 0
    print(f"{'#':>3} {'kernel':<28} {'HGMMA':>5} {'dummy':>5} {'UTMALDG':>7} {'BAR.SYNC':>8} {'LDL/STL':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'k.cubin')
        for i, image in enumerate(cubins(data), 1):
            with open(path, 'wb') as f:
                f.write(image)
            run = subprocess.run([args.nvdisasm, '-c', path], capture_output=True, text=True)
            if run.returncode != 0:
                print(f'{i:>3} (nvdisasm failed: {run.stderr.strip()[:80]})')
                continue
            sass = run.stdout
            name = re.search(r'\.text\.(\w+)', sass)
            count = lambda pattern: len(re.findall(pattern, sass))
            dummy = sass.count('HGMMA.64x8x16.F16 RZ')
            dummies += dummy
            hgmma, tma, bars, local = count(r'HGMMA'), count(r'UTMALDG'), count(r'BAR\.SYNC'), count(r'\b(?:LDL|STL)\b')
            print(f"{i:>3} {name.group(1) if name else '?':<28} {hgmma:>5} {dummy:>5} {tma:>7} {bars:>8} {local:>7}")
    if dummies:
        print(f'{dummies} dummy HGMMA group(s): a fenced commit inside a loop? (decision 096)')
    return 1 if dummies else 0


if __name__ == '__main__':
    sys.exit(main())
