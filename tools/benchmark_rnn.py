"""A training step of nn.LSTM / nn.GRU against PyTorch CPU in the same run: the same weights and
input, outputs checked to agree first, then steps of each taking turns (forward, the mean square of
the output as the loss, backward, SGD); the median step of each.

    python tools/benchmark_rnn.py [--kind LSTM] [--layers 2] [--input 64] [--hidden 128]
                                  [--batch 32] [--seq 50] [--steps 20] [--threads 2]
"""
import argparse
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=["LSTM", "GRU"], default="LSTM")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--input", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=50)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="torch's threads")
    a = p.parse_args()

    import torch

    import netcl
    from netcl import nn, optim

    torch.set_num_threads(a.threads)
    q = netcl.default_queue()
    x = np.random.default_rng(0).standard_normal((a.batch, a.seq, a.input)).astype(np.float32)
    model = getattr(nn, a.kind)(a.input, a.hidden, num_layers=a.layers, batch_first=True)
    ref = getattr(torch.nn, a.kind)(a.input, a.hidden, num_layers=a.layers, batch_first=True)
    ref.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    xt, xr = netcl.tensor(x, queue=q), torch.tensor(x)
    diff = np.abs(model(xt)[0].numpy() - ref(xr)[0].detach().numpy()).max()
    assert diff < 1e-4, f"netcl and torch disagree by {diff:.2g}"
    opt, ref_opt = optim.SGD(model.parameters(), lr=0.01), torch.optim.SGD(ref.parameters(), lr=0.01)

    def step():
        out = model(xt)[0]
        loss = (out * out).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()  # (waits for the device)

    def ref_step():
        out = ref(xr)[0]
        loss = (out * out).mean()
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        return loss.item()

    times = {"netcl": [], "torch": []}
    for i in range(a.steps + 3):  # (three warm-up pairs)
        for name, fn in (("netcl", step), ("torch", ref_step)):
            t = time.perf_counter()
            fn()
            if i >= 3:
                times[name].append(time.perf_counter() - t)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    print(f"{a.kind}({a.input}, {a.hidden}, num_layers={a.layers}) on (batch {a.batch}, seq {a.seq}), "
          f"median of {a.steps} training steps on {q.device.name.strip()}: netcl {ms['netcl']:.1f} ms, "
          f"torch CPU ({a.threads} threads) {ms['torch']:.1f} ms, netcl / torch {ms['netcl'] / ms['torch']:.2f}x")


if __name__ == "__main__":
    main()
