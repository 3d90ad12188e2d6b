#!/usr/bin/env python3
"""Writes the seed corpus of sim_ops_fuzz (tests/fuzz/corpus/sim_ops_fuzz/): small hand-made
programs, one per mechanism, in the input format sim_ops_fuzz.cpp documents. Rerun after a
change of that format: python3 tests/fuzz/seed_corpus.py

With --check BINARY (ctest sim_ops_fuzz.seeds) it writes nothing: it requires the committed corpus
to be what this script writes, and BINARY (sim_ops_fuzz, CHORUS_FUZZ_DESCRIBE=1) to decode every
seed to the world size, options, instruction count and stream length the seed was written for.
With --check-pct BINARY (ctest sim_ops_fuzz.pct_bytes) it runs one PCT program under streams of
one length that differ only in their bytes, and requires the same input to give the same schedule
and different bytes different schedules (PCT's picks take no bytes: its priorities come from the
seed, which sim_ops_fuzz derives from the stream)."""

import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple


class Seed(NamedTuple):
    data: bytes
    header: dict  # what sim_ops_fuzz must decode: its CHORUS_FUZZ_DESCRIBE "decoded" fields


POOLED, LIFO, QUARANTINE, RANDOM = range(4)
WAIT_ALL, DROP, KEEP, DROP_REVERSED = range(4)
(ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, COALESCED, WAIT, WAIT_TWO,
 DROP_HANDLE, NARROW, READ_PTR, WRITE_PTR, SCRATCH, REGISTRY, CHECK_ALL, TO_VECTOR) = range(16)


def program(world, instructions, stream=b"", allocator=POOLED, finalization=False,
            adversarial=False, pct=False, ends=(WAIT_ALL,) * 4):
    flags = (world - 2) | allocator << 2 | finalization << 4 | adversarial << 5 | pct << 6
    end_byte = sum(mode << (2 * r) for r, mode in enumerate(ends))
    body = bytes([flags, end_byte, len(instructions)])
    for a, b in instructions:
        body += bytes([a, b])
    header = {"world": world, "allocator": allocator, "finalization": int(finalization),
              "adversarial": int(adversarial), "pct": int(pct),
              "instructions": len(instructions), "stream": len(stream)}
    return Seed(body + stream, header)


def op(kind, arg=0):  # a collective: every rank
    return (kind, arg)


def on(rank, kind, arg=0):  # a local action of one rank
    return (kind | rank << 4, arg)


def every(world, kind, arg=0):
    return [on(r, kind, arg) for r in range(world)]


SEEDS = {
    # First in name order: the planted-bug test needs an all_reduce read early.
    "00-all-reduce-wait": program(2, [op(ALL_REDUCE, 3), *every(2, WAIT), *every(2, REGISTRY)]),
    "01-all-reduce-ops-read": program(3, [op(ALL_REDUCE, 8), op(ALL_REDUCE, 17), op(ALL_REDUCE, 26),
                                          *every(3, REGISTRY), *every(3, READ_PTR, 1),
                                          *every(3, TO_VECTOR, 2), *every(3, CHECK_ALL)]),
    "02-coalesced-drop-one": program(2, [op(COALESCED, 0x09), on(0, DROP_HANDLE, 0),
                                         on(0, REGISTRY), on(1, DROP_HANDLE, 1), on(1, REGISTRY),
                                         *every(2, WAIT), *every(2, REGISTRY)]),
    "03-gather-inner-dim-view": program(4, [op(ALL_GATHER, 0x82), *every(4, NARROW, 0x14),
                                            on(0, DROP_HANDLE, 0), *every(4, READ_PTR, 1),
                                            *every(4, CHECK_ALL)], ends=(DROP,) * 4),
    "04-drop-deferred": program(3, [op(ALL_REDUCE, 1), op(BROADCAST, 9), *every(3, DROP_HANDLE, 0),
                                    op(ALL_GATHER, 2), *every(3, REGISTRY)],
                                stream=b"\x01\x00\x01\x01",
                                finalization=True),
    "05-lifo-reuse": program(2, [op(ALL_REDUCE, 4), *every(2, WAIT), *every(2, DROP_HANDLE),
                                 *every(2, SCRATCH, 0x80), op(ALL_REDUCE, 4),
                                 *every(2, SCRATCH, 0x81),
                                 *every(2, CHECK_ALL), *every(2, DROP_HANDLE), op(ALL_REDUCE, 4),
                                 *every(2, REGISTRY), *every(2, CHECK_ALL)], allocator=LIFO),
    "06-keep-past-end": program(3, [op(ALL_REDUCE, 2), op(REDUCE_SCATTER, 1), on(1, WAIT, 1),
                                    *every(3, NARROW, 0x10)], ends=(KEEP, KEEP, KEEP)),
    "07-all-to-all-uneven": program(3, [op(ALL_TO_ALL, 0x80), op(ALL_TO_ALL, 0x81),
                                        op(ALL_TO_ALL, 2),
                                        *every(3, TO_VECTOR, 0), *every(3, WAIT_TWO, 0x12),
                                        *every(3, CHECK_ALL)]),
    "08-scatter-inner-dim-adversarial": program(4, [op(REDUCE_SCATTER, 0x83),
                                                    op(REDUCE_SCATTER, 0xC1),
                                                    op(ALL_REDUCE, 4), *every(4, WAIT_TWO, 0x10),
                                                    *every(4, READ_PTR, 2)],
                                                stream=bytes(range(7, 60, 3)), adversarial=True,
                                                ends=(WAIT_ALL, DROP, KEEP, DROP_REVERSED)),
    "09-random-alloc-write": program(2, [op(BROADCAST, 0x0B), *every(2, WRITE_PTR, 0),
                                         *every(2, DROP_HANDLE, 0), *every(2, SCRATCH, 0x80),
                                         op(BROADCAST, 0x0B), *every(2, WRITE_PTR, 0),
                                         *every(2, CHECK_ALL)], stream=b"\x03\x01\x02\x00\x01",
                                     allocator=RANDOM),
    "10-quarantine-drops": program(3, [op(ALL_REDUCE, 0), op(ALL_GATHER, 0), op(COALESCED, 0x20),
                                       *every(3, DROP_HANDLE, 0), *every(3, DROP_HANDLE, 0),
                                       op(COALESCED, 0x4A), *every(3, DROP_HANDLE, 1),
                                       *every(3, REGISTRY)], allocator=QUARANTINE,
                                   ends=(DROP_REVERSED,) * 3),
    "11-pct-mixed": program(4, [op(ALL_REDUCE, 1), op(COALESCED, 0x41), op(ALL_TO_ALL, 0x83),
                                on(0, WAIT_TWO, 0x21), on(1, DROP_HANDLE, 2), on(2, NARROW, 0x31),
                                on(3, WRITE_PTR, 1), op(BROADCAST, 0x1A), *every(4, REGISTRY),
                                *every(4, CHECK_ALL)], stream=bytes(range(40)), pct=True,
                            finalization=True, ends=(DROP, KEEP, WAIT_ALL, DROP_REVERSED)),
    "12-coalesced-gather-wait-both": program(2, [op(COALESCED, 0x32), *every(2, WAIT_TWO, 0x10),
                                                 op(COALESCED, 0x52), *every(2, WAIT, 3),
                                                 *every(2, REGISTRY), *every(2, CHECK_ALL)],
                                             allocator=LIFO),
    # Bit 7 of a broadcast makes it an exchange: each rank waits on (0x80) or reads (0xC0) a
    # copy of a peer's result between two barriers.
    "13-exchange-wait-peer": program(3, [op(ALL_REDUCE, 2), op(COALESCED, 0x21),
                                         op(BROADCAST, 0x80), *every(3, REGISTRY), op(ALL_GATHER, 0x81),
                                         op(BROADCAST, 0xC9), *every(3, REGISTRY),
                                         *every(3, CHECK_ALL)], allocator=LIFO,
                                     ends=(KEEP, DROP, WAIT_ALL)),
}

DIRECTORY = pathlib.Path(__file__).parent / "corpus" / "sim_ops_fuzz"


def described(binary, path, what):
    """The fields of the CHORUS_FUZZ_DESCRIBE line `what` sim_ops_fuzz prints for `path`."""
    run = subprocess.run([binary, str(path)], capture_output=True, text=True,
                         env=dict(os.environ, CHORUS_FUZZ_DESCRIBE="1"), check=False)
    line = re.search(rf"^sim_ops_fuzz: {what} (.*)$", run.stdout, re.MULTILINE)
    if run.returncode != 0 or line is None:
        sys.exit(f"{binary} {path} exited {run.returncode} without a '{what}' line:\n"
                 f"{run.stdout}{run.stderr}")
    fields = line.group(1).split()
    return dict(zip(fields[::2], fields[1::2]))


def decoded(binary, path):
    """The header fields sim_ops_fuzz decodes from the input at `path`."""
    return {key: int(value) for key, value in described(binary, path, "decoded").items()}


def check(binary):
    failures = []
    committed = sorted(p.name for p in DIRECTORY.iterdir())
    if committed != sorted(SEEDS):
        failures.append(f"{DIRECTORY} holds {committed}, this script writes {sorted(SEEDS)}")
    for name, seed in SEEDS.items():
        path = DIRECTORY / name
        if path.exists() and path.read_bytes() != seed.data:
            failures.append(f"{name}: the committed file is not what this script writes")
            continue
        header = decoded(binary, path)
        if header != seed.header:
            failures.append(f"{name}: decoded {header}, written for {seed.header}")
        else:
            print(f"{name}: {header}")
    if failures:
        sys.exit("seed corpus check failed (rerun python3 tests/fuzz/seed_corpus.py after a "
                 "format change):\n  " + "\n  ".join(failures))
    print(f"all {len(SEEDS)} seeds decode as written")


# A PCT program on 4 ranks whose other options draw no choices (Pooled, Fixed order, no chosen
# finalization): only the seed can make its schedules differ.
PCT_PROGRAM = [op(ALL_REDUCE, 1), op(COALESCED, 0x41), op(ALL_TO_ALL, 0x83), on(0, WAIT_TWO, 0x21),
               on(1, DROP_HANDLE, 2), on(2, NARROW, 0x31), on(3, WRITE_PTR, 1), op(BROADCAST, 0x1A),
               *every(4, REGISTRY), *every(4, CHECK_ALL)]
PCT_STREAMS = 8
PCT_SCHEDULES_MIN = 4  # distinct schedules required of the 8 streams (a run has ~50 decisions)


def check_pct(binary):
    with tempfile.TemporaryDirectory() as directory:
        schedules = set()
        for k in range(PCT_STREAMS):
            stream = bytes((37 * k + 11 * i) % 256 for i in range(40))
            path = pathlib.Path(directory) / f"pct-{k}"
            path.write_bytes(program(4, PCT_PROGRAM, stream=stream, pct=True).data)
            runs = [described(binary, path, "ran")["schedule_hash"] for _ in range(2)]
            if runs[0] != runs[1]:
                sys.exit(f"stream {k}: one input ran two schedules ({runs[0]}, {runs[1]})")
            print(f"stream {k}: schedule_hash {runs[0]}")
            schedules.add(runs[0])
    if len(schedules) < PCT_SCHEDULES_MIN:
        sys.exit(f"{PCT_STREAMS} PCT streams of one length ran {len(schedules)} distinct "
                 f"schedules, fewer than {PCT_SCHEDULES_MIN}: the bytes do not steer PCT")
    print(f"{PCT_STREAMS} PCT streams ran {len(schedules)} distinct schedules")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--check-pct":
        check_pct(sys.argv[2])
    elif len(sys.argv) == 1:
        DIRECTORY.mkdir(parents=True, exist_ok=True)
        for name, seed in SEEDS.items():
            (DIRECTORY / name).write_bytes(seed.data)
        print(f"wrote {len(SEEDS)} inputs to {DIRECTORY}")
    else:
        sys.exit("usage: seed_corpus.py [--check | --check-pct SIM_OPS_FUZZ_BINARY]")
