"""A training step of nn.LSTM / nn.GRU against PyTorch CPU in the same run: the same weights and
input, outputs checked to agree first, then steps of each taking turns (forward, the mean square of
the output as the loss, backward, SGD); the median step of each. With --predict, inference instead:
a classifier (the layer, then a Linear of its last step to 10 classes) in eval(), netcl's predict()
against torch's forward under no_grad, numpy in and out.

    python tools/benchmark_rnn.py [--kind LSTM] [--layers 2] [--input 64] [--hidden 128]
                                  [--batch 32] [--seq 50] [--steps 20] [--threads 2] [--predict]
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
    p.add_argument("--predict", action="store_true", help="time inference (predict()) instead of training")
    a = p.parse_args()
    if a.predict:
        return predict(a)

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

    report(a, q, "training steps", taking_turns(a.steps, step, ref_step))


def predict(a):
    import torch

    import netcl
    from netcl import nn

    torch.set_num_threads(a.threads)
    q = netcl.default_queue()

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(nn, a.kind)(a.input, a.hidden, num_layers=a.layers, batch_first=True)
            self.fc = nn.Linear(a.hidden, 10)

        def forward(self, x):
            return self.fc(self.rnn(x)[0][:, -1])

    class Ref(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, a.kind)(a.input, a.hidden, num_layers=a.layers, batch_first=True)
            self.fc = torch.nn.Linear(a.hidden, 10)

        def forward(self, x):
            return self.fc(self.rnn(x)[0][:, -1])

    model, ref = Classifier().eval(), Ref().eval()
    # (netcl's Linear weight is (in, out), torch's (out, in))
    ref.load_state_dict({k: torch.tensor(v.T if k == "fc.weight" else v) for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((a.batch, a.seq, a.input)).astype(np.float32)

    def ref_predict():
        with torch.no_grad():
            return ref(torch.from_numpy(x)).numpy()
    diff = np.abs(model.predict(x, q) - ref_predict()).max()
    assert diff < 1e-4, f"netcl and torch disagree by {diff:.2g}"
    report(a, q, "predict() calls", taking_turns(a.steps, lambda: model.predict(x, q), ref_predict))


def taking_turns(steps, fn, ref_fn):
    """{name: the median seconds} of netcl's fn and torch's ref_fn run in turns, after three warm-up pairs."""
    times = {"netcl": [], "torch": []}
    for i in range(steps + 3):
        for name, f in (("netcl", fn), ("torch", ref_fn)):
            t = time.perf_counter()
            f()
            if i >= 3:
                times[name].append(time.perf_counter() - t)
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def report(a, q, what, ms):
    print(f"{a.kind}({a.input}, {a.hidden}, num_layers={a.layers}) on (batch {a.batch}, seq {a.seq}), "
          f"median of {a.steps} {what} on {q.device.name.strip()}: netcl {ms['netcl']:.1f} ms, "
          f"torch CPU ({a.threads} threads) {ms['torch']:.1f} ms, netcl / torch {ms['netcl'] / ms['torch']:.2f}x")


if __name__ == "__main__":
    main()
