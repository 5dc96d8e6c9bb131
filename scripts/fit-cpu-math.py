#!/usr/bin/env python3
"""The polynomial coefficients of the CPU's float32 exp and tanh (Note [Float exp and tanh] in
codegen/cpu/cpu_math.h): fits of least maximum relative error, by Lawson's iteration (weighted least
squares, reweighted by each point's error) on Chebyshev-spaced points, in 40-digit arithmetic.
Needs mpmath (Debian: python3-mpmath). Prints each fit's coefficients, highest power first."""
import struct

import mpmath as mp

mp.mp.dps = 40


def fit(points, basis_target, degree, iterations=30):
    """Fits sum c_j s^j to target(x) with (s, target, scale) = basis_target(x): the error
    scale * (sum c_j s^j - target) is the relative error of the function it approximates."""
    weights = [mp.mpf(1)] * len(points)
    for _ in range(iterations):
        a = mp.matrix(len(points), degree + 1)
        b = mp.matrix(len(points), 1)
        for i, x in enumerate(points):
            s, target, scale = basis_target(x)
            row_scale = mp.sqrt(weights[i]) * scale
            for j in range(degree + 1):
                a[i, j] = row_scale * s**j
            b[i] = row_scale * target
        coefficients = mp.qr_solve(a, b)[0]
        errors = []
        for x in points:
            s, target, scale = basis_target(x)
            errors.append(abs(scale * (sum(coefficients[j] * s**j for j in range(degree + 1)) - target)))
        total = sum(w * e for w, e in zip(weights, errors))
        weights = [w * e / total * len(points) for w, e in zip(weights, errors)]
    return [coefficients[j] for j in range(degree, -1, -1)], max(errors)


def chebyshev(lo, hi, count):
    return [lo + (hi - lo) * (1 - mp.cos(mp.pi * (k + mp.mpf(0.5)) / count)) / 2 for k in range(count)]


def exp_target(r):
    # exp(r) = 1 + r + r^2 Q(r); relative error of exp(r).
    return r, (mp.exp(r) - 1 - r) / (r * r), r * r / mp.exp(r)


def tanh_target(a):
    # tanh(a) = a + a^3 P(a^2); relative error of tanh(a).
    s = a * a
    return s, (mp.tanh(a) / a - 1) / s, a * s / mp.tanh(a)


half_ln2 = mp.log(2) / 2 * mp.mpf("1.0001")
for name, points, target, degree in [
    ("Q of exp on [-ln2/32, ln2/32], after the tables of 2^(j/16)",
     [r for r in chebyshev(-half_ln2 / 16, half_ln2 / 16, 200) if abs(r) > 1e-9], exp_target, 1),
    ("P of tanh on [0, 1]", [a for a in chebyshev(0, 1, 400) if a > 0], tanh_target, 6),
]:
    coefficients, error = fit(points, target, degree)
    print(f"{name}: max relative error {float(error):.3g}")
    print("  " + ", ".join(repr(float(c)) for c in coefficients))
sixteenths = [mp.power(2, mp.mpf(j) / 16) for j in range(16)]
rounded = [float(mp.mpf(v)) for v in sixteenths]  # to float64 here; the C++ literal rounds to float
print("2^(j/16), j = 0..15 (written as float literals, which round them to float32)")
print("  " + ", ".join(repr(v) for v in rounded))
print("2^(j/16) less its float32 rounding")
to_float32 = [float(mp.mpf(struct.unpack("f", struct.pack("f", v))[0])) for v in rounded]
print("  " + ", ".join(repr(float(v - mp.mpf(f))) for v, f in zip(sixteenths, to_float32)))
