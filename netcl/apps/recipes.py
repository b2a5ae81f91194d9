"""Small end-to-end recipes used by `netcl train`, `make demo`, the benchmarks and the tests: the
digits classifier, photographs for detector26, and batch-norm calibration from data."""
import math
import sys
import time

import numpy as np

from netcl import models, nn, optim
from netcl.nn import manual_seed
from netcl.tensor import Tensor
from netcl.trainstep import TrainStep


def digits_data(test_fraction=0.25, seed=0):
    """scikit-learn's 8x8 digits (1797 images, shipped inside the package) as
    (x_train, y_train, x_test, y_test); x is (N, 1, 8, 8) float32 in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the digits recipe needs scikit-learn: pip install scikit-learn") from None
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    idx = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    te, tr = idx[:n_test], idx[n_test:]
    return x[tr], y[tr], x[te], y[te]


def digits_cnn():
    """A small CNN for (N, 1, 8, 8) digits: two Conv-BN-ReLU-MaxPool blocks and a classifier."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(32 * 2 * 2, 10))


class Progress:
    """A dependency-free progress bar (tqdm when installed); `postfix` shows the running metrics."""

    def __init__(self, total, desc, enabled=True):
        self.total, self.desc, self.n, self.enabled = total, desc, 0, enabled
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True)
            except ImportError:
                pass
        self.postfix = ""

    def update(self, k=1, **metrics):
        """Advance by `k` steps and show `metrics` (name=value) beside the bar."""
        self.n += k
        self.postfix = " ".join(f"{key}={val:.4g}" for key, val in metrics.items())
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.update(k)
        else:
            width = 30
            done = int(width * self.n / max(self.total, 1))
            sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} {self.postfix}")
            if self.n >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    def close(self):
        """End the bar (tqdm's, where it is in use)."""
        if self._bar is not None:
            self._bar.close()


def accuracy(model, queue, x, y, batch_size=256):
    """Top-1 accuracy and the logits, in eval mode (the caller sets the mode)."""
    logits = np.concatenate([model(Tensor.from_host(queue, x[i:i + batch_size])).to_host()
                             for i in range(0, len(x), batch_size)])
    return float((logits.argmax(1) == y).mean()), logits


def train_classifier(model, queue, data, epochs=10, batch_size=64, lr=2e-3, seed=0, progress=True,
                     optimizer=None, start_epoch=0, on_epoch=None, cosine=False, augment=None):
    """Adam + cross-entropy over shuffled mini-batches. Returns (optimizer, history); history holds
    per-epoch train loss, train accuracy and test accuracy. `on_epoch(epoch, model, opt)` runs after each.
    `cosine`: the learning rate follows a half cosine from `lr` down to 0 over the epochs.
    `augment(x, rng)`: a function of a training batch (host array) and a generator, e.g. random_shift."""
    x_tr, y_tr, x_te, y_te = data
    loss_fn = nn.CrossEntropyLoss()
    model.to(queue)
    opt = optimizer or optim.Adam(model.parameters(), lr=lr)
    step = TrainStep(model, loss_fn, opt)  # replays the recorded step once it repeats
    history = {"epoch": [], "loss": [], "train_acc": [], "test_acc": [], "seconds": []}
    steps = -(-len(x_tr) // batch_size)
    t0 = time.perf_counter()
    for epoch in range(start_epoch, epochs):
        if cosine:
            opt.lr = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
        bar = Progress(steps, f"epoch {epoch + 1}/{epochs}", progress)
        model.train()
        order = np.random.default_rng([seed, epoch]).permutation(len(x_tr))  # resumable: depends on the epoch only
        aug_rng = np.random.default_rng([seed, epoch, 1])
        losses, correct = [], 0
        for s in range(steps):
            idx = order[s * batch_size:(s + 1) * batch_size]
            xb = x_tr[idx] if augment is None else augment(x_tr[idx], aug_rng)
            loss = step(xb, y_tr[idx])  # the data needs no gradient (TrainStep: input_grad=False)
            correct += int((step.output.to_host().argmax(1) == y_tr[idx]).sum())
            losses.append(loss.item())
            bar.update(loss=float(np.mean(losses[-20:])), acc=correct / min((s + 1) * batch_size, len(x_tr)))
        model.eval()
        test_acc, _ = accuracy(model, queue, x_te, y_te)
        bar.update(0, loss=float(np.mean(losses)), acc=correct / len(x_tr), test_acc=test_acc)
        bar.close()
        for k, v in (("epoch", epoch + 1), ("loss", float(np.mean(losses))), ("train_acc", correct / len(x_tr)),
                     ("test_acc", test_acc), ("seconds", time.perf_counter() - t0)):
            history[k].append(v)
        if on_epoch is not None:
            on_epoch(epoch + 1, model, opt)
    return opt, history


def random_shift(x, rng, pixels=1):
    """Each image of a batch (N, C, H, W) shifted by up to `pixels` in each direction, zeros filled in:
    the digits' only augmentation (a digit drawn a pixel off is still the same digit)."""
    out = np.zeros_like(x)
    h, w = x.shape[-2:]
    for i, (dy, dx) in enumerate(rng.integers(-pixels, pixels + 1, (len(x), 2))):
        out[i, :, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            x[i, :, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def digits_at(input_shape, data=None):
    """The digits (train and test) at a model's per-sample input shape (C, S, S): each 8x8 image
    upsampled by S/8 (nearest) and repeated over the C channels."""
    x_tr, y_tr, x_te, y_te = data if data is not None else digits_data()
    c, size = input_shape[0], input_shape[-1]

    def fit(x):
        k = size // x.shape[-1]
        return np.ascontiguousarray(np.repeat(np.repeat(np.repeat(x, k, 2), k, 3), c, 1))
    return fit(x_tr), y_tr, fit(x_te), y_te


# How the reference classifiers train on the digits (measured: tools/train_reference.py).
REFERENCE_TRAINING = {
    "resnet8": {"epochs": 12, "lr": 3e-3, "shift": 4},  # shift: random_shift pixels at the model's size
    "vit_tiny": {"epochs": 20, "lr": 2e-3, "shift": 0},
    "mobilenetv2_tiny": {"epochs": 10, "lr": 3e-3, "shift": 4},
}


def train_reference(name, queue, epochs=None, seed=0, progress=True):
    """A reference classifier of netcl.models trained on the digits at its input size with the
    settings of REFERENCE_TRAINING: (model, optimizer, history)."""
    cfg = dict(REFERENCE_TRAINING[name])
    manual_seed(seed)
    model = models.build(name)
    data = digits_at(models.MODELS[name].input_shape, digits_data(seed=seed))
    shift = cfg["shift"]
    opt, hist = train_classifier(model, queue, data, epochs=epochs or cfg["epochs"], lr=cfg["lr"], seed=seed,
                                 progress=progress, cosine=True,
                                 augment=(lambda x, rng: random_shift(x, rng, shift)) if shift else None)
    return model, opt, hist


def digits_masks(size=64, data=None, noise=0.4, seed=0):
    """A segmentation task from the digits: noisy images (N, 3, size, size) (upsampled, 3 channels,
    Gaussian noise of std `noise` on every pixel and channel) and the clean digits' foreground masks
    (N, 1, size, size), 1 where the ink is at least half its darkest, for train and test. The noise
    makes it a real task: a threshold of the input no longer recovers the mask."""
    x_tr, _, x_te, _ = data if data is not None else digits_data()
    (xs_tr, _, xs_te, _) = digits_at((3, size, size), (x_tr, None, x_te, None))
    rng = np.random.default_rng(seed)

    def noisy(x):
        return (x + rng.normal(0, noise, x.shape)).astype(np.float32)
    return noisy(xs_tr), (xs_tr[:, :1] >= 0.5).astype(np.float32), noisy(xs_te), (xs_te[:, :1] >= 0.5).astype(np.float32)


def iou(logits, masks):
    """Intersection over union of the predicted foreground (logit > 0) and the true masks."""
    pred, true = logits > 0, masks > 0.5
    return float((pred & true).sum() / max((pred | true).sum(), 1))


def train_segmentation(model, queue, data, epochs=6, batch_size=32, lr=3e-3, seed=0, progress=True):
    """Per-pixel binary cross-entropy (through a Sigmoid appended for training) with Adam and a cosine
    schedule; history holds the loss and the test IoU per epoch."""
    x_tr, m_tr, x_te, m_te = data
    train_net = nn.Sequential(model, nn.Sigmoid()).to(queue)
    loss_fn = nn.BCELoss()
    opt = optim.Adam(model.parameters(), lr=lr)
    step = TrainStep(train_net, loss_fn, opt)
    history = {"epoch": [], "loss": [], "test_iou": [], "seconds": []}
    steps, t0 = -(-len(x_tr) // batch_size), time.perf_counter()
    for epoch in range(epochs):
        opt.lr = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
        bar = Progress(steps, f"epoch {epoch + 1}/{epochs}", progress)
        train_net.train()
        order, losses = np.random.default_rng([seed, epoch]).permutation(len(x_tr)), []
        for s in range(steps):
            idx = order[s * batch_size:(s + 1) * batch_size]
            losses.append(step(x_tr[idx], m_tr[idx]).item())  # read after the step: no wait mid-step
            bar.update(loss=float(np.mean(losses[-20:])))
        model.eval()
        logits = np.concatenate([model(Tensor.from_host(queue, x_te[i:i + 64])).to_host()
                                 for i in range(0, len(x_te), 64)])
        score = iou(logits, m_te)
        bar.update(0, loss=float(np.mean(losses)), test_iou=score)
        bar.close()
        for k, v in (("epoch", epoch + 1), ("loss", float(np.mean(losses))), ("test_iou", score),
                     ("seconds", time.perf_counter() - t0)):
            history[k].append(v)
    return opt, history


def photos(size=256):
    """The photographs shipped inside scikit-learn (china.jpg, flower.jpg), resized to size x size,
    as (2, 3, size, size) float32 in [0, 1]."""
    try:
        from PIL import Image
        from sklearn.datasets import load_sample_images
    except ImportError:
        raise ImportError("the photographs need scikit-learn and pillow: pip install scikit-learn pillow") from None
    imgs = [np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR), np.float32) / 255.0
            for im in load_sample_images().images]
    return np.stack(imgs).transpose(0, 3, 1, 2).copy()


def photo_crops(n, size=256, seed=0):
    """n random crops (random scale, position, flip) of the sample photographs, resized to size x size."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    srcs = load_sample_images().images
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        im = srcs[i % len(srcs)]
        h, w = im.shape[:2]
        side = int(rng.integers(min(h, w) // 3, min(h, w) + 1))
        y0, x0 = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = Image.fromarray(im[y0:y0 + side, x0:x0 + side]).resize((size, size), Image.BILINEAR)
        a = np.asarray(crop, np.float32) / 255.0
        out[i] = (a[:, ::-1] if rng.random() < 0.5 else a).transpose(2, 0, 1)
    return out


def calibrate_batchnorm(model, queue, x, batch_size=8):
    """Set every BatchNorm2d's running statistics from data: cumulative averages of the batch
    statistics over `x` (the result of a short training-mode pass with no weight updates)."""
    bns = [m for m in model if isinstance(m, nn.BatchNorm2d)]
    saved = [m.momentum for m in bns]
    model.to(queue).train()
    for k, i in enumerate(range(0, len(x), batch_size)):
        for m in bns:
            m.momentum = 1.0 / (k + 1)  # running average of the k+1 batches seen so far
        model(Tensor.from_host(queue, x[i:i + batch_size]))
    for m, mom in zip(bns, saved):
        m.momentum = mom
    return model.eval()


def calibrate_batchnorm_on_photos(model, queue, input_shape, count=16, batch_size=8, seed=0, rng=None):
    """calibrate_batchnorm on `count` crops of the sample photographs (photo_crops, seeded with
    `seed`) at the model's input size; without scikit-learn or pillow, on uniform noise in [0, 1)
    drawn from `rng` (default: a generator seeded with `seed`). input_shape: one sample's (C, H, W).
    Returns where the statistics came from: "photos", "noise", or None for a model without
    BatchNorm2d, which is left as it is."""
    if not any(isinstance(m, nn.BatchNorm2d) for m in model):
        return None
    try:
        calib, source = photo_crops(count, size=input_shape[-1], seed=seed), "photos"
    except ImportError:
        rng = np.random.default_rng(seed) if rng is None else rng
        calib, source = rng.uniform(0, 1, (count,) + tuple(input_shape)).astype(np.float32), "noise"
    calibrate_batchnorm(model, queue, calib, batch_size=batch_size)
    return source

