"""Device selection, one context and queue per device, cached programs, pooled buffers."""
from netcl.runtime.device import DeviceInfo, devices, select_device
from netcl.runtime.program import build, kernel_source

_queues = {}  # device spec -> CommandQueue
_pools = {}  # context -> MemoryPool
_kernels = {}  # (context, family, options) -> {name: Kernel}


def default_queue(spec=None):
    """The pyopencl.CommandQueue of the selected device (see select_device); one per device per process."""
    import pyopencl as cl

    device = select_device(spec)
    q = _queues.get(device.int_ptr)
    if q is None:
        q = _queues[device.int_ptr] = cl.CommandQueue(cl.Context([device]))
    return q


def device_class(queue):
    """'gpu' or 'cpu': picks launch sizes and kernel variants."""
    import pyopencl as cl

    return "gpu" if queue.device.type & cl.device_type.GPU else "cpu"


def kernels(queue, family, options=()):
    """Kernels of netcl/kernels/<family>.cl built for the queue's context, by name (cached)."""
    key = (queue.context, family, tuple(options))
    ks = _kernels.get(key)
    if ks is None:
        prog = build(queue.context, kernel_source(family), options)
        ks = _kernels[key] = {k.function_name: k for k in prog.all_kernels()}
    return ks


def alloc(queue, nbytes):
    """A device buffer of `nbytes` from the context's pool; it returns to the pool when dropped."""
    import pyopencl.tools as clt

    pool = _pools.get(queue.context)
    if pool is None:
        pool = _pools[queue.context] = clt.MemoryPool(clt.ImmediateAllocator(queue))
    return pool.allocate(max(int(nbytes), 4))


__all__ = ["DeviceInfo", "devices", "select_device", "default_queue", "device_class", "kernels", "alloc", "build",
           "kernel_source"]
