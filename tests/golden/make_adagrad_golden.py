#!/usr/bin/env python3
"""Writes tests/golden/adagrad_dlrm_dcn.txt: an independent reference for
model = dlrm_dcn and the Adagrad of MLPerf DLRMv2, computed in float64 with
numpy alone (no chanter code), for test_model_adagrad_golden.c.

Made with:  python3 tests/golden/make_adagrad_golden.py > tests/golden/adagrad_dlrm_dcn.txt
            (numpy 2.4.6, Python 3; the output depends on neither: every
            input is drawn once here from numpy's legacy RandomState, whose
            stream numpy keeps fixed, and rounded to float32)

The model (chanter's layout, model.h): 2 dense features, 2 tables of 5 rows
of dim 4 (hotness 2 and 1, summed), bottom MLP 2-4-4 (ReLU), x0 =
[bottom, emb_0, emb_1] (d0 = 12), 2 DCNv2 cross layers of rank 2,
x_{l+1} = x0 * (U_l (V_l^T x_l) + b_l) + x_l, top MLP 12-4-1 (ReLU on the
hidden layer), batch 3, the mean BCE-with-logits loss.

Optimizers, as the reference defines them:
  dense: torch.optim.Adagrad (lr_decay 0, weight_decay 0, initial
         accumulator 0):  h += g*g;  w -= lr * g / (sqrt(h) + eps)
  rows:  FBGEMM's EXACT_ADAGRAD (TorchRec's torch.optim.Adagrad on an
         embedding bag, MLPerf DLRMv2's choice), the same rule per element
         of each row's batch-summed gradient ("adagrad"), and
         EXACT_ROWWISE_ADAGRAD, h += mean_d(g_d^2) one float per row,
         w_d -= lr * g_d / (sqrt(h) + eps) ("rowwise_adagrad").
Two steps on the same batch, so that the second step's update depends on
the accumulator (the first one's is lr * sign(g) for any |g| >> eps).  Each
case is run with eps = 1e-8 (the reference's) and eps = 1e-2, where
sqrt(h) + eps and sqrt(h + eps) tell apart.

The fixture is redrawn until it is well conditioned for a float32
comparison and exercises every parameter: every ReLU input at least 1e-3
and every gradient (dense, and of each row the batch uses) at least 1e-4
away from 0 in both steps -- no dead unit, and float32 rounding cannot
flip a ReLU or an update's sign.

Format: '#' lines are comments; each section is a line "name count"
followed by count numbers.
"""
import sys

import numpy as np

B, ND, NT, DIM, ROWS = 3, 2, 2, 4, 5
HOT = [2, 1]
BOTTOM = [4]  # model.bottom_mlp; the bottom MLP ends at DIM
TOP = [4]  # model.top_mlp; an output of 1 is appended
L, R = 2, 2  # model.cross_layers, model.cross_rank
D0 = DIM + NT * DIM
LR = 0.1
EPS = [1e-8, 1e-2]
IDS = [np.array([[0, 3], [3, 3], [1, 4]]), np.array([[2], [2], [0]])]
LABELS = np.array([1.0, 0.0, 1.0])


def layout():
    """(name, shape) of every tensor in chanter's parameter order."""
    t, i = [], ND
    for k, o in enumerate(BOTTOM + [DIM]):
        t += [("bot%d.w" % k, (o, i)), ("bot%d.b" % k, (o,))]
        i = o
    for l in range(L):
        t += [("v%d" % l, (R, D0)), ("u%d" % l, (D0, R)), ("cb%d" % l, (D0,))]
    i = D0
    for k, o in enumerate(TOP + [1]):
        t += [("top%d.w" % k, (o, i)), ("top%d.b" % k, (o,))]
        i = o
    return t


def unpack(flat):
    p, o = {}, 0
    for name, shape in layout():
        n = int(np.prod(shape))
        p[name] = flat[o:o + n].reshape(shape)
        o += n
    return p


def relu(v):
    return np.maximum(v, 0.0)


def step_grads(flat, tables, dense):
    """Forward and backward of the mean loss: logits, loss, dense grads
    (flat), row grads per table [ROWS x DIM] (batch-summed), and the
    smallest |ReLU input| seen."""
    p = unpack(flat)
    nb = len(BOTTOM) + 1
    acts, x, small = [dense], dense, np.inf
    for k in range(nb):
        a = x @ p["bot%d.w" % k].T + p["bot%d.b" % k]
        small = min(small, np.abs(a).min())
        x = relu(a)
        acts.append(x)
    pooled = [tables[t][IDS[t]].sum(axis=1) for t in range(NT)]
    x0 = np.concatenate([x] + pooled, axis=1)
    xs, ts, zs = [x0], [], []
    for l in range(L):
        t_ = xs[-1] @ p["v%d" % l].T
        z = t_ @ p["u%d" % l].T + p["cb%d" % l]
        ts.append(t_)
        zs.append(z)
        xs.append(x0 * z + xs[-1])
    ta, h = [xs[-1]], xs[-1]
    for k in range(len(TOP) + 1):
        a = h @ p["top%d.w" % k].T + p["top%d.b" % k]
        if k < len(TOP):
            small = min(small, np.abs(a).min())
            a = relu(a)
        ta.append(a)
        h = a
    logit = h[:, 0]
    loss = np.mean(np.maximum(logit, 0) - logit * LABELS + np.log1p(np.exp(-np.abs(logit))))
    g = {}
    dh = ((1.0 / (1.0 + np.exp(-logit)) - LABELS) / B)[:, None]
    for k in reversed(range(len(TOP) + 1)):
        if k < len(TOP):
            dh = dh * (ta[k + 1] > 0)
        g["top%d.w" % k] = dh.T @ ta[k]
        g["top%d.b" % k] = dh.sum(axis=0)
        dh = dh @ p["top%d.w" % k]
    gx, dx0 = dh, np.zeros_like(x0)
    for l in reversed(range(L)):
        dz = gx * x0
        dx0 += gx * zs[l]
        g["cb%d" % l] = dz.sum(axis=0)
        g["u%d" % l] = dz.T @ ts[l]
        dt = dz @ p["u%d" % l]
        g["v%d" % l] = dt.T @ xs[l]
        gx = gx + dt @ p["v%d" % l]
    dx0 += gx
    db = dx0[:, :DIM]
    for k in reversed(range(nb)):
        db = db * (acts[k + 1] > 0)
        g["bot%d.w" % k] = db.T @ acts[k]
        g["bot%d.b" % k] = db.sum(axis=0)
        db = db @ p["bot%d.w" % k]
    rowg = []
    for t in range(NT):
        rg = np.zeros((ROWS, DIM))
        de = dx0[:, DIM + t * DIM:DIM + (t + 1) * DIM]
        for i in range(B):
            for r in IDS[t][i]:
                rg[r] += de[i]
        rowg.append(rg)
    grads = np.concatenate([g[name].ravel() for name, _ in layout()])
    return logit, loss, grads, rowg, small


def adagrad(w, h, g, eps):
    h = h + g * g
    return w - LR * g / (np.sqrt(h) + eps), h


def train(flat, tables, dense, kind, eps):
    """Two steps; returns (params, [tables with state]) and the fixture's
    worst conditioning (smallest |ReLU input|, smallest nonzero |grad|)."""
    w, hd = flat.copy(), np.zeros_like(flat)
    tabs = [t.copy() for t in tables]
    hs = [np.zeros((ROWS, DIM if kind == "adagrad" else 1)) for _ in range(NT)]
    worst = np.inf
    for _ in range(2):
        _, _, gr, rowg, small = step_grads(w, tabs, dense)
        used = [rowg[t][sorted(set(IDS[t].ravel()))].ravel() for t in range(NT)]
        worst = min(worst, small, 10.0 * np.abs(np.concatenate([gr] + used)).min())
        w, hd = adagrad(w, hd, gr, eps)
        for t in range(NT):
            for r in sorted(set(IDS[t].ravel())):
                gg = rowg[t][r]
                if kind == "adagrad":
                    tabs[t][r], hs[t][r] = adagrad(tabs[t][r], hs[t][r], gg, eps)
                else:
                    hs[t][r] = hs[t][r] + np.mean(gg * gg)
                    tabs[t][r] = tabs[t][r] - LR * gg / (np.sqrt(hs[t][r]) + eps)
    return w, [np.concatenate([tabs[t], hs[t]], axis=1) for t in range(NT)], worst


def draw(seed):
    rs = np.random.RandomState(seed)
    f32 = lambda a: a.astype(np.float32).astype(np.float64)
    flat = []
    for name, shape in layout():
        if len(shape) == 2:  # Xavier-uniform, as chanter's model_init
            lim = np.sqrt(6.0 / (shape[0] + shape[1]))
            v = rs.uniform(-lim, lim, size=shape)
        elif name.startswith(("bot", "top0")):  # ReLU layers' biases: units alive
            v = rs.uniform(0.5, 1.0, size=shape)
        else:
            v = rs.uniform(-0.1, 0.1, size=shape)
        flat.append(f32(v).ravel())
    flat = np.concatenate(flat)
    tables = [f32(rs.uniform(-0.5, 0.5, size=(ROWS, DIM))) for _ in range(NT)]
    dense = f32(rs.uniform(-1.0, 1.0, size=(B, ND)))
    return flat, tables, dense


def main():
    for seed in range(1, 1000):
        flat, tables, dense = draw(seed)
        runs = {(k, e): train(flat, tables, dense, k, e) for k in ("adagrad", "rowwise_adagrad") for e in EPS}
        if min(r[2] for r in runs.values()) > 1e-3:
            break
    else:
        sys.exit("no well-conditioned fixture in 999 seeds")
    logit, loss, grads, rowg, _ = step_grads(flat, tables, dense)
    out = sys.stdout
    out.write("# adagrad_dlrm_dcn: written by tests/golden/make_adagrad_golden.py (numpy %s), fixture seed %d;\n"
              "# see that script for the model, the optimizers and the format\n" % (np.__version__, seed))

    def sec(name, vals, fmt="%.17g"):
        vals = np.asarray(vals, dtype=np.float64).ravel()
        out.write("%s %d\n%s\n" % (name, vals.size, " ".join(fmt % v for v in vals)))

    sec("lr", [LR])
    sec("eps", EPS)
    sec("dense", dense, "%.9g")
    for t in range(NT):
        sec("ids%d" % t, IDS[t], "%d")
    sec("labels", LABELS, "%g")
    sec("params", flat, "%.9g")
    for t in range(NT):
        sec("table%d" % t, tables[t], "%.9g")
    sec("logits", logit)
    sec("loss", [loss])
    sec("grads", grads)
    for t in range(NT):
        sec("rowgrad%d" % t, rowg[t])
    for ei, e in enumerate(EPS):
        for k in ("adagrad", "rowwise_adagrad"):
            w, tabs, _ = runs[(k, e)]
            sec("after2.%s.eps%d.params" % (k, ei), w)
            for t in range(NT):
                sec("after2.%s.eps%d.table%d" % (k, ei, t), tabs[t])


if __name__ == "__main__":
    main()
