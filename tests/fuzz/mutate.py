"""A seeded byte mutator for file fuzzing: ``mutate(data, seed, index)`` gives the same mutant on every run.

Operators (AFL-style havoc, on whole files): bit flips, random bytes, "interesting" integers (0, -1, 0x7F..,
0x80.., 2**31, a 1 TiB varint), truncation, zeroed spans, duplicated spans, deleted spans and inserted random
bytes; one to three are stacked. Positions are drawn half uniformly over the file and half within its first or
last 512 bytes, where the headers live (a zip's central directory and an ONNX model's metadata are at the end),
so a large float payload does not soak up every mutation.

Why a plain seeded mutator rather than Hypothesis (which the property tests use): the inputs are whole files
whose interest lies in being *almost* valid. Mutating a valid file reaches the loaders' deep checks (manifest,
tensors, zip members), where bytes generated from scratch fail at the first magic number; a mutant must replay
from ``(seed, index)`` alone in another process (the campaign runs commands in worker processes to survive
native crashes, which Hypothesis's in-process shrinking and example database do not fit); and a failing file
is kept as it is, as a regression case, rather than shrunk.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

EDGE = 512

INTERESTING = [
    b"\x00", b"\xff", b"\x7f", b"\x80", b"\x01",
    b"\x00\x00", b"\xff\xff", b"\xff\x7f", b"\x00\x80",
    b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80",
    struct.pack("<q", -1), struct.pack("<Q", 1 << 62), struct.pack("<Q", (1 << 63) - 1),
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # a 10-byte varint (2**63)
    b"\x80\x80\x80\x80\x80\x20",  # a varint of 2**40 (a 1 TiB length prefix)
    struct.pack("<f", float("nan")), struct.pack("<f", float("inf")), struct.pack("<f", -1.0),
]


class Rng(random.Random):
    """The mutator's seeded generator, with the position rule: half the positions uniform over the file, half
    within its first or last ``EDGE`` bytes; with ``edges``, all of them there."""

    def __init__(self, seed: str, edges: bool = False) -> None:
        super().__init__(seed)
        self.edges = edges

    def pos(self, n: int) -> int:
        if n <= 1:
            return 0
        r = 0.5 + self.random() / 2 if self.edges else self.random()
        if r < 0.5:
            return self.randrange(n)
        if r < 0.75:
            return self.randrange(min(n, EDGE))
        return n - 1 - self.randrange(min(n, EDGE))

    def span(self, n: int) -> int:
        """A span length: mostly short, sometimes up to a quarter of the file."""
        cap = max(1, n // 4)
        return min(cap, self.choice([1, 2, 4, 8, 16, 64, 256, self.randint(1, cap)]))


def flip_bits(data: bytearray, rng: Rng) -> str:
    k = rng.choice([1, 1, 1, 2, 4, 8])
    where = []
    for _ in range(k):
        i = rng.pos(len(data))
        b = rng.randrange(8)
        data[i] ^= 1 << b
        where.append(f"{i}.{b}")
    return f"flip {','.join(where)}"


def random_bytes(data: bytearray, rng: Rng) -> str:
    k = rng.choice([1, 2, 4, 8])
    where = []
    for _ in range(k):
        i = rng.pos(len(data))
        data[i] = rng.randrange(256)
        where.append(str(i))
    return f"bytes {','.join(where)}"


def interesting(data: bytearray, rng: Rng) -> str:
    value = rng.choice(INTERESTING)
    i = rng.pos(len(data))
    data[i : i + len(value)] = value[: max(0, len(data) - i)]
    return f"interesting {value.hex()}@{i}"


def truncate(data: bytearray, rng: Rng) -> str:
    i = rng.pos(len(data))
    del data[i:]
    return f"truncate {i}"


def zero_span(data: bytearray, rng: Rng) -> str:
    i, n = rng.pos(len(data)), rng.span(len(data))
    data[i : i + n] = bytes(len(data[i : i + n]))
    return f"zero {i}+{n}"


def duplicate_span(data: bytearray, rng: Rng) -> str:
    i, n = rng.pos(len(data)), rng.span(len(data))
    j = rng.pos(len(data))
    data[j:j] = data[i : i + n]
    return f"duplicate {i}+{n}@{j}"


def delete_span(data: bytearray, rng: Rng) -> str:
    i, n = rng.pos(len(data)), rng.span(len(data))
    del data[i : i + n]
    return f"delete {i}+{n}"


def insert_random(data: bytearray, rng: Rng) -> str:
    i, n = rng.pos(len(data)), rng.span(len(data))
    data[i:i] = rng.randbytes(n)
    return f"insert {n}@{i}"


OPERATORS: dict[str, Callable[[bytearray, Rng], str]] = {
    "flip": flip_bits, "bytes": random_bytes, "interesting": interesting, "truncate": truncate,
    "zero": zero_span, "duplicate": duplicate_span, "delete": delete_span, "insert": insert_random,
}
WEIGHTS = {"flip": 4, "bytes": 2, "interesting": 2, "truncate": 1, "zero": 2, "duplicate": 1, "delete": 1,
           "insert": 1}


def mutate(data: bytes, seed: int, index: int, operators: tuple[str, ...] | None = None,
           edges: bool = False) -> tuple[bytes, str]:
    """(mutant, description) number ``index`` of campaign ``seed``: one to three operators applied to ``data``.

    ``operators`` limits the choice (default: all); ``edges`` puts every position within the first or last
    512 bytes (the headers). The same arguments give the same mutant on every machine.
    """
    rng = Rng(f"edgebnn-fuzz/{seed}/{index}", edges)
    names = list(operators or OPERATORS)
    weights = [WEIGHTS[n] for n in names]
    out = bytearray(data)
    steps = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if not out:
            break
        steps.append(OPERATORS[rng.choices(names, weights)[0]](out, rng))
    return bytes(out), "; ".join(steps)
