"""netcl.data: torch.utils.data's Dataset, TensorDataset and DataLoader, yielding device Tensors.

    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, drop_last=True)
    for xb, yb in loader:                # xb float32, yb int32 (integer data), on the loader's queue
        step(xb, yb)

Batches are made and uploaded by a background thread while the caller's step runs: it indexes the
dataset (a TensorDataset's arrays in one fancy index each, other datasets item by item through
collate_fn), converts the leaves (float data to float32, integer and boolean data to int32) and
queues their uploads on the loader's queue (on PoCL's CPU devices through a staging buffer on host
memory, as netcl.tensor._upload stages small uploads: _Slot), up to prefetch_factor batches ahead.
The order of an epoch is drawn when iteration starts, on the caller's thread, from
netcl's generator (netcl.manual_seed; a checkpoint saves it) or `generator`.

Why a batch's device buffers are never overwritten while a step that reads them is still queued:
uploads go to the same in-order queue as the steps, and a buffer is refilled only once every Tensor
on it (and every view) is gone; a command that reads a batch was enqueued while its Tensor was
alive, so before the upload that refills it. netcl.TrainStep binds each batch's buffers to its
recorded kernels anew (it keeps the last batch's Tensors, so their buffers wait for the next)."""
import collections.abc
import queue as queues
import threading
import weakref

import numpy as np

from netcl import array_ops, runtime
from netcl.rng import rng
from netcl.tensor import FLOAT32, INT32, Tensor, _stages_on, _upload


class Dataset:
    """A map-style dataset, as torch.utils.data.Dataset: subclasses define __getitem__(index) and
    __len__()."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class TensorDataset(Dataset):
    """TensorDataset(*tensors): item i is the tuple of every tensor's row i. tensors: numpy arrays,
    netcl Tensors (read to the host once) or anything numpy.asarray takes, all with the same first
    dimension."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        arrays = tuple(t.numpy() if isinstance(t, Tensor) else np.asarray(t) for t in tensors)
        for a in arrays:
            if a.ndim == 0 or a.shape[0] != arrays[0].shape[0]:
                raise ValueError(f"TensorDataset's tensors must share their first dimension, got shapes "
                                 f"{[a.shape for a in arrays]}")
        self.tensors = arrays

    def __getitem__(self, index):
        return tuple(a[index] for a in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


def default_collate(batch):
    """Samples to a batch, as torch's default_collate: arrays and numbers stacked along a new first
    dimension (numpy arrays, uploaded by the loader), tuples and lists per position (a list), dicts
    per key, strings as a list."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return np.stack([t.numpy() for t in batch])
    if isinstance(elem, (np.ndarray, np.generic, int, float, bool)):
        return np.stack([np.asarray(b) for b in batch])
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        return {k: default_collate([b[k] for b in batch]) for k in elem}
    if isinstance(elem, collections.abc.Sequence):
        if any(len(b) != len(elem) for b in batch):
            raise ValueError("each sample of a batch must have the same number of fields")
        return [default_collate(list(field)) for field in zip(*batch)]
    raise TypeError(f"default_collate: a sample holds a {type(elem).__name__}; expected numpy arrays, numbers, "
                    "netcl Tensors, tuples, lists or dicts of them (or give collate_fn)")


def _positive(name, v, allow_none=False):
    if v is None and allow_none:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {v!r:.50}")
    return int(v)


class DataLoader:
    """DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, num_workers=0, collate_fn=None,
    pin_memory=False, drop_last=False, generator=None, prefetch_factor=2, persistent_workers=False,
    queue=None): batches of `dataset` as device Tensors on `queue` (default: netcl.default_queue()),
    made by a background thread (see the module docstring).

    shuffle: a new order every epoch, drawn from netcl's generator (or `generator`, a numpy
    Generator). sampler: an iterable of indices instead (not with shuffle). batch_size=None yields
    the samples one by one. collate_fn(list of samples) -> a batch of numpy arrays (or netcl
    Tensors, lists, tuples, dicts of them), uploaded as default_collate's. num_workers,
    pin_memory and persistent_workers are accepted for torch's signature: netcl prepares batches in
    one background thread and stages uploads itself."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, generator=None, prefetch_factor=2, persistent_workers=False,
                 queue=None):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"DataLoader takes a map-style dataset (__getitem__ and __len__), got "
                            f"{type(dataset).__name__}")
        if shuffle and sampler is not None:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r:.50}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError("collate_fn must be callable")
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy Generator, got {type(generator).__name__}")
        self.dataset, self.batch_size = dataset, _positive("batch_size", batch_size, allow_none=True)
        self.shuffle, self.sampler, self.drop_last = bool(shuffle), sampler, bool(drop_last)
        self.collate_fn, self.generator, self.queue = collate_fn, generator, queue
        self.prefetch_factor = _positive("prefetch_factor", prefetch_factor)
        self.num_workers, self.pin_memory, self.persistent_workers = num_workers, pin_memory, persistent_workers
        self._free = {}  # (nbytes, context) -> device buffers whose batch Tensors are gone, to refill

    def _order(self):
        """This epoch's sample indices (drawn now, on the caller's thread)."""
        if self.sampler is not None:
            return [int(i) for i in self.sampler]
        n = len(self.dataset)
        if self.shuffle:
            return (self.generator if self.generator is not None else rng()).permutation(n).tolist()
        return list(range(n))

    def _batches(self, order):
        if self.batch_size is None:
            return [[i] for i in order]
        b = self.batch_size
        cut = len(order) // b * b if self.drop_last else len(order)
        return [order[k:k + b] for k in range(0, cut, b)]

    def __len__(self):
        n = len(list(self.sampler)) if self.sampler is not None else len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        import pyopencl as cl

        q = self.queue if self.queue is not None else runtime.default_queue()
        if q.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
            raise ValueError("DataLoader needs an in-order queue (its uploads are ordered with the steps that read "
                             "them)")
        return _Epoch(self, q, self._batches(self._order()))

    # -- on the background thread ------------------------------------------------------------
    def _host_batch(self, indices):
        """The batch of samples `indices`, on the host."""
        ds = self.dataset
        if self.batch_size is None:
            return ds[indices[0]]
        if type(ds) is TensorDataset and self.collate_fn is None:
            idx = np.asarray(indices)
            return [a[idx] for a in ds.tensors]
        return (self.collate_fn or default_collate)([ds[i] for i in indices])

    def _to_device(self, q, value):
        """Arrays and host Tensors of a host batch as device Tensors (float32, or int32 for integer data)."""
        if isinstance(value, Tensor):
            return value if value.on_device else self._upload(q, value.numpy())
        if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
            return self._upload(q, np.asarray(value))
        if isinstance(value, (str, bytes)):
            return value
        if isinstance(value, collections.abc.Mapping):
            return {k: self._to_device(q, v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(self._to_device(q, v) for v in value)
        if isinstance(value, list):
            return [self._to_device(q, v) for v in value]
        return value

    def _upload(self, q, a):
        if a.dtype.kind in "iub":
            a, dtype = np.asarray(array_ops.host_ints(a), order="C"), INT32
        elif a.dtype.kind == "f":
            a, dtype = np.asarray(a, np.float32, order="C"), FLOAT32
        else:
            raise TypeError(f"DataLoader uploads numbers: a batch holds an array of dtype {a.dtype}")
        key = (max(a.nbytes, 4), q.context.int_ptr)
        free = self._free.setdefault(key, [])
        try:
            slot = free.pop()
        except IndexError:
            slot = _Slot(q, key[0])
        t = Tensor(a.shape, q, slot.buf, dtype=dtype)
        weakref.finalize(t.storage, free.append, slot)  # refilled once the batch's Tensors are gone
        slot.fill(q, a.reshape(-1))
        t._st.host = a.reshape(-1)  # the data (and kept alive while an upload may read it)
        return t


class _Slot:
    """A batch field's device buffer, refilled batch after batch; on PoCL's CPU devices with a
    staging buffer on host memory of its own (USE_HOST_PTR, which PoCL reads in place) and the
    event of its last copy: PoCL returns from a write of host memory only once every command
    queued before it has run (tensor._upload), which held the loader's thread for a whole step
    where a batch did not fit tensor._upload's staging slots."""

    def __init__(self, q, nbytes):
        import pyopencl as cl

        self.buf, self.host, self.stage, self.copied = runtime.buffer(q, nbytes), None, None, None
        if _stages_on(q) is not None:
            self.host = np.empty(nbytes // 4, np.float32)
            self.stage = cl.Buffer(q.context, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=self.host)

    def fill(self, q, flat):
        """Queue the copy of host array `flat` (4-byte elements) into the buffer."""
        import pyopencl as cl

        if not flat.size:
            return
        if self.stage is None:
            _upload(q, self.buf, flat)
            return
        if self.copied is not None:
            self.copied.wait()  # (long done: the buffer is refilled only after its batch's steps were queued)
        self.host[:flat.size] = flat.view(np.float32)  # (int32 data copied bit for bit)
        self.copied = cl.enqueue_copy(q, self.buf, self.stage, byte_count=flat.nbytes)


class _Epoch:
    """One pass over a DataLoader: a background thread makes the batches, at most prefetch_factor ahead."""

    def __init__(self, loader, q, batches):
        self._ready = queues.Queue(maxsize=loader.prefetch_factor)
        self._stop = threading.Event()
        self._left = len(batches)
        self._thread = threading.Thread(target=_produce, args=(loader, q, batches, self._ready, self._stop),
                                        name="netcl-DataLoader", daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __len__(self):
        return self._left

    def __next__(self):
        if self._left == 0:
            raise StopIteration
        kind, value = self._ready.get()
        if kind == "error":
            self._left = 0
            raise value
        self._left -= 1
        return value

    def close(self):
        """Stop making batches (an epoch left early)."""
        self._stop.set()

    def __del__(self):
        self._stop.set()


def _produce(loader, q, batches, ready, stop):
    """The background thread: each batch made, uploaded and handed over in order; an error is
    handed over in the place of its batch."""
    for indices in batches:
        try:
            item = ("batch", loader._to_device(q, loader._host_batch(indices)))
        except Exception as e:  # (the caller's next() raises it)
            item = ("error", e)
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                break
            except queues.Full:
                continue
        if stop.is_set() or item[0] == "error":
            return
