"""Least-squares fits for the report."""

from __future__ import annotations


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (a, b, r squared)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, (1 - ss_res / ss_tot) if ss_tot else 1.0


def fit2(rows: list[tuple[float, float, float]]) -> tuple[float, float, float, float]:
    """Least squares y = a + b x1 + c x2 over (x1, x2, y): (a, b, c, r squared)."""
    n = len(rows)
    m1, m2, my = (sum(r[i] for r in rows) / n for i in range(3))
    s11 = sum((r[0] - m1) ** 2 for r in rows)
    s22 = sum((r[1] - m2) ** 2 for r in rows)
    s12 = sum((r[0] - m1) * (r[1] - m2) for r in rows)
    s1y = sum((r[0] - m1) * (r[2] - my) for r in rows)
    s2y = sum((r[1] - m2) * (r[2] - my) for r in rows)
    det = s11 * s22 - s12 * s12
    if not det:
        return my, 0.0, 0.0, 0.0
    b = (s1y * s22 - s2y * s12) / det
    c = (s2y * s11 - s1y * s12) / det
    a = my - b * m1 - c * m2
    ss_tot = sum((r[2] - my) ** 2 for r in rows)
    ss_res = sum((r[2] - a - b * r[0] - c * r[1]) ** 2 for r in rows)
    return a, b, c, (1 - ss_res / ss_tot) if ss_tot else 1.0
