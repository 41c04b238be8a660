"""
The cost model's fits to measurements: a weighted line, the all-reduce's alpha and bus bandwidth, the step
time's plane over blocking and overlapped syncs, and each point's leave-one-out prediction (fitted by
tpcomm/experiments/calibration.py; docs/cost_model.md).
"""

from tpcomm.costmodel.cost_model import ring_bytes


def fit_line(xs, ys, *, weights=None):
    """Weighted least squares y = a + b x: (a, b). ValueError when the xs cannot determine a slope."""
    w = weights or [1.0] * len(xs)
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs two distinct x values, got {list(xs)}")
    sw = sum(w)
    xm = sum(wi * x for wi, x in zip(w, xs)) / sw
    ym = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - xm) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - xm) * (y - ym) for wi, x, y in zip(w, xs, ys)) / sxx
    return ym - b * xm, b


def fit_allreduce(samples, p):
    """(alpha, B) from (bytes, seconds) samples of p-rank all-reduces. Least squares of the
    relative error, weights 1/t^2: the times span several decades, and plain least squares
    would fit the largest messages only."""
    nbytes, seconds = [s[0] for s in samples], [s[1] for s in samples]
    alpha, slope = fit_line([ring_bytes(n, p) for n in nbytes], seconds,
                            weights=[1 / t ** 2 for t in seconds])
    if slope <= 0:
        raise ValueError(f"the all-reduce times do not grow with the size (slope {slope:.3g} s/B)")
    return alpha, 1 / slope


def fit_plane(xs, zs, ys):
    """Least squares y = a + b x - h z: (a, b, h). ValueError when the points cannot determine the three
    (fewer than three, or x and z collinear over them)."""
    rows = [(1.0, x, -z) for x, z in zip(xs, zs)]
    A = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]  # normal equations A p = v
    v = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    scale = max(abs(a) for row in A for a in row) or 1.0
    for col in range(3):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(A[r][col]))
        if abs(A[pivot][col]) < 1e-9 * scale:
            raise ValueError(f"a plane needs x and z varying independently, got x {list(xs)}, z {list(zs)}")
        A[col], A[pivot], v[col], v[pivot] = A[pivot], A[col], v[pivot], v[col]
        for r in range(col + 1, 3):
            f = A[r][col] / A[col][col]
            A[r] = [a - f * b for a, b in zip(A[r], A[col])]
            v[r] -= f * v[col]
    out = [0.0] * 3
    for r in (2, 1, 0):
        out[r] = (v[r] - sum(A[r][c] * out[c] for c in range(r + 1, 3))) / A[r][r]
    return tuple(out)


def fit_step(xs, ys, zs=None):
    """(C, t, h) of ms/iter = C + N t - N_ovl h: the plane when some of the points overlap
    all-reduces (zs), else the line with h = 0 (nothing known to be hidden: a pattern that overlaps
    is predicted as if it did not)."""
    if zs is not None and any(zs):
        try:
            return fit_plane(xs, zs, ys)
        except ValueError:
            pass
    return (*fit_line(xs, ys), 0.0)


def leave_one_out(xs, ys, *, zs=None):
    """For each point, the fit on all the others (fit_step: line, or plane with zs, the overlapped counts)
    evaluated at it; None where the others cannot determine a line."""
    zs = [0] * len(xs) if zs is None else zs
    out = []
    for i in range(len(xs)):
        others = [j for j in range(len(xs)) if j != i]
        try:
            a, b, h = fit_step([xs[j] for j in others], [ys[j] for j in others], [zs[j] for j in others])
            out.append(a + b * xs[i] - h * zs[i])
        except ValueError:
            out.append(None)
    return out
