#!/usr/bin/env python3
"""The polynomial coefficients of the CPU's float32 exp and tanh (Note [Float exp and tanh] in
codegen/cpu_math.h): fits of least maximum relative error, by Lawson's iteration (weighted least
squares, reweighted by each point's error) on Chebyshev-spaced points, in 40-digit arithmetic.
Needs mpmath (Debian: python3-mpmath). Prints each fit's coefficients, highest power first."""
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
    ("Q of exp on [-ln2/2, ln2/2]", [r for r in chebyshev(-half_ln2, half_ln2, 300) if abs(r) > 1e-6],
     exp_target, 5),
    ("Q of exp inside tanh, after a table of 2^(j/16)",
     [r for r in chebyshev(-half_ln2 / 16, half_ln2 / 16, 200) if abs(r) > 1e-9], exp_target, 1),
    ("P of tanh on [0, 1]", [a for a in chebyshev(0, 1, 400) if a > 0], tanh_target, 6),
]:
    coefficients, error = fit(points, target, degree)
    print(f"{name}: max relative error {float(error):.3g}")
    print("  " + ", ".join(repr(float(c)) for c in coefficients))
print("2^(j/16), j = 0..15, rounded to float32 when written as float literals")
print("  " + ", ".join(repr(float(mp.power(2, mp.mpf(j) / 16))) for j in range(16)))
