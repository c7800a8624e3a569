#!/usr/bin/env python3
"""Finds serial global loads in the loops of compiled kernels, without a GPU.

A load whose result is used before the thread issues any other global load costs one full memory
round trip (~600-800 ns from HBM, ~300 from L2) on its own; inside a loop that is one round trip
per iteration, and a short loop of them is a latency chain no occupancy hides when a kernel has
few warps (a decode step's CTAs at batch 1). Session 27 found the two-stage token kernel's ring
CTA this way: dot_heads waited for each 16-byte K load before issuing the next, 16 round trips per
token at d 128 (kernels/index/token_score.cuh, docs/performance.md).

The audit reads `cuobjdump -sass` text. A loop is the address range a backward branch jumps over.
In a loop, an LDG (global load; shared-memory LDS and constant loads do not count) is reported
as *serial* when a later instruction reads its destination register(s) before any other LDG is
issued. It is a heuristic over the static code: it does not see predication, which path runs,
or loads issued in an earlier iteration (software pipelining across iterations shows up as
serial); read the reported pairs with --show, and confirm with Nsight Compute's source page
(long-scoreboard stalls at the consumer).

Usage:
  scripts/sass-audit.py FILE [--kernel SUBSTRING] [--show] [--cuobjdump PATH]
FILE is cuobjdump -sass text, or an object / executable / cubin (cuobjdump is run on it: --cuobjdump,
else $CUOBJDUMP, else cuobjdump on PATH or in /usr/local/cuda/bin; the PyPI package
nvidia-cuda-cuobjdump provides one on a machine without the toolkit's). One line per kernel:
serial loads in loops, global loads in all, static instructions, the kernel's mangled name.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

_INS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_FUNC = re.compile(r"Function : (\S+)")
_BRA = re.compile(r"\bBRA(?:\.\w+)*\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")
_LDG = re.compile(r"(?:@!?U?P\w+\s+)?(LDG\S*)\s+(R\d+)")
_IS_LDG = re.compile(r"(?:@!?U?P\w+\s+)?LDG")
_REG = re.compile(r"\bR(\d+)\b")
_PRED = re.compile(r"^@!?U?P\w+\s+")


def kernels(lines):
    """Yields (mangled name, [(address, instruction text)]) for each function of the listing."""
    name, body = None, []
    for line in lines:
        m = _FUNC.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = _INS.match(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, body


def registers_written(opcode, dst):
    """The registers an LDG of `opcode` writes from `dst` on (.64: two, .128: four)."""
    first = int(dst[1:])
    width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
    return {str(first + k) for k in range(width)}


def audit(body):
    """Returns (loops, serial) for one kernel: the backward-branch ranges and, for each serial
    load inside one, (load address, load, consumer address, consumer)."""
    loops = []
    for addr, ins in body:
        m = _BRA.search(ins)
        if m and m.group(1) and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    # First pass: each load's first consumer (the index of the instruction that reads what it
    # wrote), or None.
    first_use = {}
    for i, (addr, ins) in enumerate(body):
        m = _LDG.match(ins)
        if not m:
            continue
        written = registers_written(m.group(1), m.group(2))
        first_use[i] = None
        for j in range(i + 1, len(body)):
            parts = _PRED.sub("", body[j][1]).split(None, 1)
            if len(parts) < 2:
                continue
            # Sources: the operands after the destination; stores, branches and mma read them all.
            reads_all = parts[0].startswith(("ST", "BRA", "HMMA", "IMMA"))
            operands = parts[1] if reads_all else parts[1].split(",", 1)[-1] if "," in parts[1] else ""
            if set(_REG.findall(operands)) & written:
                first_use[i] = j
                break
    # A load in a loop is serial when it overlaps no other: none issued between it and its use,
    # and none issued before it still unused when it goes out.
    serial = []
    for i, use in first_use.items():
        addr = body[i][0]
        if use is None or not any(lo <= addr <= hi for lo, hi in loops):
            continue
        after = any(i < k < use for k in first_use)
        before = any(k < i and u is not None and u > i for k, u in first_use.items())
        if not after and not before:
            serial.append((addr, body[i][1], body[use][0], body[use][1]))
    return loops, serial


def sass_text(path, cuobjdump):
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    tool = cuobjdump or os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool and os.path.exists("/usr/local/cuda/bin/cuobjdump"):
        tool = "/usr/local/cuda/bin/cuobjdump"
    if not tool:
        sys.exit("sass-audit: no cuobjdump (give --cuobjdump, or pip install nvidia-cuda-cuobjdump)")
    out = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--show", action="store_true", help="list each serial load and its consumer")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args(argv)
    for name, body in kernels(sass_text(args.file, args.cuobjdump)):
        if args.kernel not in name:
            continue
        _, serial = audit(body)
        ldg = sum(1 for _, ins in body if _IS_LDG.match(ins))
        print(f"{len(serial):4d} serial in loops / {ldg:4d} LDG / {len(body):6d} instructions  {name}")
        if args.show:
            for addr, ins, addr2, ins2 in serial:
                print(f"       {addr:05x} {ins}\n         -> {addr2:05x} {ins2}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
