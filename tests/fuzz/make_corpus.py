#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets: tests/fuzz/corpus/{decode,engine,compact}/.

Seeds give libFuzzer a start inside the interesting space (sound payloads
to mutate, each kind of broken one, every engine configuration) rather than
leaving it to find the magic number and matching headers by itself. The
layouts are those described at the top of fuzz_decode.c, fuzz_engine.c and
fuzz_compact.c.
Deterministic: rerunning rewrites the same bytes.
    python3 tests/fuzz/make_corpus.py
"""
import math
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = 0x44474331
NONFINITE, FAILED, DENSE = 1, 2, 4


def payload(flags, step, n, k, pairs):
    """One payload: header, then k indices, then k values (pairs padded with (0, 0.0))."""
    pairs = list(pairs) + [(0, 0.0)] * (k - len(pairs))
    idx = b"".join(struct.pack("<I", i) for i, _ in pairs)
    val = b"".join(v if isinstance(v, bytes) else struct.pack("<f", v) for _, v in pairs)
    return struct.pack("<IIQQQ", MAGIC, flags, step, n, k) + idx + val


def decode_seed(nranks, n, k, step, bits, payloads):
    """The choice bytes of fuzz_decode, then the gathered payloads."""
    assert 1 <= nranks <= 8 and 1 <= n <= 4096 and 1 <= k <= min(n, 64)
    head = bytes([nranks - 1, (n - 1) & 0xFF, (n - 1) >> 8, k - 1, step, bits])
    return head + b"".join(payloads)


def random_pairs(rng, n, k, distinct=True):
    idx = rng.sample(range(n), k) if distinct else [rng.randrange(n) for _ in range(k)]
    return [(i, rng.uniform(-4, 4)) for i in idx]


def decode_seeds():
    rng = random.Random(1)
    s = {}
    ok = lambda r, n, k, step: [payload(0, step, n, k, random_pairs(rng, n, k, False)) for _ in range(r)]
    s["ok_1rank"] = decode_seed(1, 100, 4, 3, 0, ok(1, 100, 4, 3))
    s["ok_3ranks"] = decode_seed(3, 1000, 16, 7, 0x10, ok(3, 1000, 16, 7))
    s["ok_8ranks_k64"] = decode_seed(8, 4096, 64, 200, 0x20, ok(8, 4096, 64, 200))
    s["ok_zeroed_flavour"] = decode_seed(2, 50, 8, 1, 0x01, ok(2, 50, 8, 1))
    s["ok_n1"] = decode_seed(4, 1, 1, 0, 0, [payload(0, 0, 1, 1, [(0, float(r))]) for r in range(4)])
    # 1 + 1e8 - 1e8 in rank order is 0: any other order gives 1.
    s["ok_rank_order"] = decode_seed(3, 8, 2, 5, 0x40, [
        payload(0, 5, 8, 2, [(3, 1.0), (6, 0.5)]),
        payload(0, 5, 8, 2, [(3, 1e8), (0, -2.0)]),
        payload(0, 5, 8, 2, [(3, -1e8), (6, 0.25)])])
    odd = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x01\x00\x00\x00", b"\x00\x00\x00\x80",
           b"\xff\xff\x7f\x7f", b"\x01\x00\x80\x7f"]  # NaN, Inf, subnormal, -0, FLT_MAX, sNaN
    s["ok_odd_values"] = decode_seed(2, 16, 6, 9, 0, [
        payload(0, 9, 16, 6, [(j, v) for j, v in enumerate(odd)]),
        payload(0, 9, 16, 6, [(j, v) for j, v in enumerate(odd)])])
    s["nonfinite_rank1"] = decode_seed(2, 64, 4, 2, 0, [
        payload(0, 2, 64, 4, random_pairs(rng, 64, 4)), payload(NONFINITE, 2, 64, 4, [])])
    for name, flags in [("failed", FAILED), ("dense", DENSE), ("failed_dense", FAILED | DENSE),
                        ("unknown_flag", 8), ("nonfinite_failed", NONFINITE | FAILED)]:
        s["flag_" + name] = decode_seed(3, 32, 2, 4, 0x02, [
            payload(0, 4, 32, 2, []), payload(flags, 4, 32, 2, []), payload(0, 4, 32, 2, [])])
    good = lambda: payload(0, 6, 40, 3, random_pairs(rng, 40, 3))
    bad_magic = bytearray(good())
    bad_magic[0] ^= 1
    s["bad_magic"] = decode_seed(2, 40, 3, 6, 0x02, [good(), bytes(bad_magic)])
    s["bad_step"] = decode_seed(2, 40, 3, 6, 0x04, [good(), payload(0, 7, 40, 3, [])])
    s["bad_n"] = decode_seed(2, 40, 3, 6, 0x06, [payload(0, 6, 41, 3, []), good()])
    s["bad_k"] = decode_seed(2, 40, 3, 6, 0x02, [good(), payload(0, 6, 40, 4, [])])
    s["bad_index_eq_n"] = decode_seed(3, 40, 3, 6, 0x02, [
        good(), good(), payload(0, 6, 40, 3, [(1, 1.0), (2, 2.0), (40, 3.0)])])
    s["bad_index_max"] = decode_seed(1, 40, 3, 6, 0x09, [payload(0, 6, 40, 3, [(0xFFFFFFFF, 1.0)])])
    s["bad_index_stamped"] = decode_seed(2, 40, 3, 6, 0x08, [
        b"\0" * 32 + struct.pack("<III", 5, 39, 41) + b"\0" * 12, good()])
    s["truncated"] = decode_seed(4, 500, 32, 11, 0, ok(4, 500, 32, 11))[:-700]
    s["choices_only"] = bytes([7, 0xFF, 0x0F, 63, 0, 0x0E])
    return s


def engine_seed(n, k, momentum=0, nesterov=0, masking=1, clip=0, steps=1, ratio=0, nranks=1, tame=1,
                in_place=0, g_off=0, out_off=0, grad=b""):
    """The choice bytes of fuzz_engine (table indices, as there), then gradient bytes."""
    assert 16 <= n <= 8192 and 1 <= k <= n
    head = struct.pack("<HH", n - 16, k - 1) + bytes([
        momentum | nesterov << 2 | masking << 3 | clip << 4 | (steps - 1) << 6,
        ratio | (nranks - 1) << 3 | tame << 6 | in_place << 7,
        g_off | out_off << 4])
    return head + grad


def floats(values):
    return b"".join(struct.pack("<f", v) for v in values)


def engine_seeds():
    rng = random.Random(2)
    gauss = lambda m: floats(rng.gauss(0, 1) for _ in range(m))
    s = {}
    s["plain_n64_k4"] = engine_seed(64, 4, grad=gauss(64))
    s["plain_4steps_sampled"] = engine_seed(1000, 10, steps=4, ratio=5, grad=gauss(257))
    s["momentum_masking"] = engine_seed(512, 32, momentum=1, steps=4, ratio=3, grad=gauss(300))
    s["nesterov_no_masking"] = engine_seed(300, 30, momentum=2, nesterov=1, masking=0, steps=3, grad=gauss(101))
    s["clip_nranks4"] = engine_seed(256, 16, momentum=1, clip=2, nranks=4, steps=2, ratio=2, grad=gauss(256))
    s["clip_tiny"] = engine_seed(100, 5, clip=1, steps=2, grad=gauss(100))
    s["k_equals_n"] = engine_seed(2048, 2048, ratio=7, steps=2, grad=gauss(500))
    s["k1_ratio_small"] = engine_seed(2000, 1, ratio=6, steps=3, grad=gauss(333))
    s["in_place_offsets"] = engine_seed(777, 20, steps=2, in_place=1, g_off=3, out_off=9, grad=gauss(200))
    s["separate_out_offset"] = engine_seed(129, 7, out_off=13, g_off=1, grad=gauss(129))
    s["all_zero"] = engine_seed(64, 8, steps=2)
    s["ties"] = engine_seed(200, 50, steps=2, grad=floats([1.5]))
    # 6000 equal values and k = 10: every one reaches the sampled threshold,
    # more than the 4096 candidates kept, so the exact selection runs.
    s["ties_exact_fallback"] = engine_seed(6000, 10, steps=2, ratio=5, grad=floats([0.25]))
    s["nan_then_finite"] = engine_seed(32, 4, steps=2, tame=0, grad=floats([1.0] * 31 + [float("nan")]) + gauss(32))
    s["inf_with_clip"] = engine_seed(48, 3, clip=2, momentum=1, tame=0, grad=floats([float("inf")] + [0.5] * 47))
    s["overflow"] = engine_seed(16, 2, steps=3, tame=0, grad=floats([3e38, -3e38] * 8))
    s["subnormal"] = engine_seed(40, 5, steps=2, tame=0, grad=b"\x01\x00\x00\x00\x00\x00\x00\x80\x07\x00\x40\x00")
    s["raw_bytes"] = engine_seed(90, 9, momentum=1, steps=4, tame=0, grad=bytes(rng.randrange(256) for _ in range(360)))
    return s


def compact_layout(n, k, value_bits):
    """dgc_compact_layout_for: (L, U, offsets of the upper, low and value areas, bytes)."""
    cost = lambda low: k * low + k + ((n - 1) >> low)
    low = min(range(33), key=lambda l: (cost(l), l))
    upper_bits = k + ((n - 1) >> low)
    words = lambda bits: (bits + 63) // 64
    upper = 40
    low_off = upper + 8 * words(upper_bits)
    values = low_off + 8 * words(k * low)
    return low, upper_bits, upper, low_off, values, values + 8 * words(k * value_bits)


def binade(x):
    return math.frexp(abs(x))[1] - 1


def payload_scale(values):
    """The scale e of 16-bit values already on its grid: the binade of the largest."""
    m = max([abs(v) for v in values] + [0.0])
    return binade(m) if m else 0


def half_bits(y):
    """The binary16 bits of y, which must be exact."""
    b = struct.pack("<e", y)
    assert struct.unpack("<e", b)[0] == y and math.copysign(1, struct.unpack("<e", b)[0]) == math.copysign(1, y), y
    return struct.unpack("<H", b)[0]


def compact_payload(n, k, value_bits, pairs, step=3, flags=0, count=None, scale=None, reserved=0, grid=None):
    """A compact payload (wire_compact.h) of sorted pairs; 16-bit values must
    lie on the grid of their payload's scale (or of grid, when given). count,
    scale and reserved override the count word's fields."""
    low, upper_bits, upper, low_off, values, size = compact_layout(n, k, value_bits)
    e = payload_scale([v for _, v in pairs]) if value_bits == 16 else 0
    e = e if grid is None else grid
    up = lo = va = 0
    for j, (i, v) in enumerate(pairs):
        up |= 1 << ((i >> low) + j)
        lo |= (i & ((1 << low) - 1)) << (j * low)
        if value_bits == 16:
            u = half_bits(math.ldexp(v, 14 - e))
        else:
            u = struct.unpack("<I", struct.pack("<f", v))[0]
        va |= u << (j * value_bits)
    e = e if scale is None else scale
    word = (len(pairs) if count is None else count) | reserved << 40 | (e & 0xFFFF) << 48
    out = struct.pack("<IIQQQ", MAGIC, flags, step, n, k) + struct.pack("<Q", word)
    out += up.to_bytes(low_off - upper, "little") + lo.to_bytes(values - low_off, "little")
    out += va.to_bytes(size - values, "little")
    assert len(out) == size
    return out


def compact_seed(n, k, value_bits, payload_bytes, errlen=3, stamp=0, clear=0):
    """The choice bytes of fuzz_compact, then the payload."""
    assert 1 <= n <= 1 << 32 and 1 <= k <= min(n, 256)
    nbytes = max(1, ((n - 1).bit_length() + 7) // 8)
    head = bytes([(value_bits == 16) | errlen << 1 | stamp << 3 | (nbytes - 1) << 4 | clear << 6])
    head += (n - 1).to_bytes(4, "little") + struct.pack("<H", k - 1)
    return head + payload_bytes


def compact_seeds():
    rng = random.Random(3)
    vals = [1.0, -2.5, 0.375, -0.0, 1024.0, -0.0625, 65536.0, 0.5]  # few significant bits: on any grid here
    s = {}

    def add(name, n, k, vb, idx, count=None, errlen=3, stamp=0, values=None, **kw):
        values = values or vals
        pairs = [(i, values[j % len(values)]) for j, i in enumerate(idx)]
        s[name] = compact_seed(n, k, vb, compact_payload(n, k, vb, pairs, count=count, **kw), errlen, stamp)

    # 11 significant bits over many binades, down to binary16's subnormals
    # under the scale (2^-38 below a largest near 1).
    fine = [math.ldexp(rng.randrange(1024, 2048), -10) * rng.choice((1, -1)) for _ in range(20)]
    fine += [math.ldexp(rng.randrange(1, 1024), -38), -math.ldexp(1, -24), math.ldexp(2047, -10)]
    for vb in (16, 32):
        add("ok_random_%d" % vb, 1000, 10, vb, sorted(rng.sample(range(1000), 7)))
        add("ok_full_%d" % vb, 4096, 64, vb, sorted(rng.sample(range(4096), 64)))
        add("ok_last_alone_%d" % vb, 669706, 200, vb, [669705])
        add("ok_all_at_end_%d" % vb, 50000, 100, vb, list(range(49900, 50000)))
        add("ok_dense_start_%d" % vb, 300, 256, vb, list(range(256)))
        add("ok_fine_values_%d" % vb, 100000, 100, vb, sorted(rng.sample(range(100000), 23)), values=fine)
    add("ok_empty", 77, 5, 16, [])
    add("ok_n1", 1, 1, 32, [0], errlen=0)
    add("ok_k_eq_n", 200, 200, 16, sorted(rng.sample(range(200), 150)))
    add("ok_n_2p32", 1 << 32, 3, 32, [5, 1 << 31, (1 << 32) - 1])
    add("ok_n_2p32_m1", (1 << 32) - 1, 1, 16, [(1 << 32) - 2])
    add("ok_stamped", 5000, 40, 16, sorted(rng.sample(range(5000), 20)), stamp=1)
    add("ok_scale_max", 3000, 8, 16, [3, 9, 2999], values=[math.ldexp(2047, 117), -math.ldexp(1, 100), 0.0])
    add("ok_scale_min", 3000, 8, 16, [0, 1, 2], values=[math.ldexp(1, -149), -0.0, math.ldexp(1, -149)])
    add("ok_zeros_16", 3000, 8, 16, [4, 5], values=[-0.0, 0.0])
    add("bad_count_gt_k", 1000, 10, 32, [1, 2, 3], count=11)
    add("bad_lone_zero_pair", 1000, 10, 16, [0], values=[0.0])
    add("bad_reserved_bits", 1000, 10, 16, [1, 2, 3], reserved=0x10)
    add("bad_scale_range", 1000, 10, 16, [1, 2, 3], scale=128)
    # The largest, 1.0, coded as y = 2^13 under e = 1: not in [2^e, 2^(e+1)).
    add("bad_scale_not_canonical", 1000, 10, 16, [1, 2, 3], values=[1.0, 0.5, -0.25], grid=1)
    add("bad_scale_not_exact", 1000, 10, 16, [1, 2, 3], values=[1.0, 3.0, 0.5], scale=-149)
    add("bad_scale_with_32", 1000, 10, 32, [1, 2, 3], scale=1)
    add("bad_scale_all_zero", 1000, 10, 16, [7], values=[-0.0], scale=5)
    trailing = bytearray(compact_seed(1000, 10, 32, compact_payload(1000, 10, 32, [(4, 1.0)])))
    trailing[-1] = 1
    s["bad_trailing_value"] = bytes(trailing)
    # Upper-area damage in a sound 5-pair payload: an extra set bit, a
    # missing one, and two pairs made equal through their low slots.
    n, k = 1000, 9
    low, upper_bits, upper, low_off, values, size = compact_layout(n, k, 16)
    base = compact_payload(n, k, 16, [(3, 1.0), (17, -2.0), (600, 0.5), (601, 3.0), (999, -0.25)])
    for name, (byte, mask) in {"bad_extra_upper_bit": (upper + 2, 0x40), "bad_missing_upper_bit": (upper + 2, 0x08)}.items():
        b = bytearray(base)
        b[byte] ^= mask
        s[name] = compact_seed(n, k, 16, bytes(b))
    b = bytearray(base)
    lows = int.from_bytes(b[low_off:values], "little")
    lows = (lows & ~(((1 << low) - 1) << (3 * low))) | ((600 & ((1 << low) - 1)) << (3 * low))
    b[low_off:values] = lows.to_bytes(values - low_off, "little")
    s["bad_duplicate"] = compact_seed(n, k, 16, bytes(b))
    b = bytearray(base)
    b[values + 2:values + 4] = struct.pack("<H", 0x7C00)  # slot 1 binary16 Inf
    s["bad_half_inf"] = compact_seed(n, k, 16, bytes(b))
    inf32 = compact_payload(n, k, 32, [(3, 1.0), (17, -2.0)])
    b = bytearray(inf32)
    low32, _, _, _, values32, _ = compact_layout(n, k, 32)
    b[values32 + 4:values32 + 8] = struct.pack("<I", 0x7F800000)
    s["bad_fp32_inf"] = compact_seed(n, k, 32, bytes(b))
    s["choices_only"] = bytes([0x31, 0xFF, 0xFF, 0x00, 0x00, 0x40, 0x00])
    return s


def write(kind, seeds):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("decode", decode_seeds())
    write("engine", engine_seeds())
    write("compact", compact_seeds())
