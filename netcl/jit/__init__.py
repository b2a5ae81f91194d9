"""The fused inference path: Sequential.eval() turns the layer list into a plan of stages.

    Conv2d [+ BatchNorm2d] [+ activation] [+ MaxPool2d(2)]  -> one conv kernel (BN folded)
    depthwise Conv2d [+ BatchNorm2d] [+ activation]         -> one depthwise conv kernel
    Conv1d [+ BatchNorm1d] [+ activation], a column-route   -> im2col, a GEMM per group (BN folded), one
        Conv2d [+ BatchNorm2d] [+ activation]                  bias + activation kernel (cols)
    [LayerNorm +] Linear [+ activation]                     -> one linear kernel (the LayerNorm folded in)
    Transpose, Linear [+ act], the same Transpose           -> one linear kernel along the inner axis
    [LayerNorm +] MultiheadAttention [+ activation]         -> input projection, attention, output projection
    LayerNorm; Transpose; global average pooling            -> one kernel each (a Transpose(1, 2) before an
                                                               AdaptiveAvgPool1d(1) is read in place)
    Residual [+ activation]                                 -> its shortcut's and body's stages; the add
                                                               (and the activation) in the epilogue of the
                                                               body's last conv or Linear, else one add kernel
    Concat                                                  -> its branches' stages, each writing its slice
                                                               of one output buffer (else one copy kernel)
    Flatten, Dropout, Identity                              -> no kernel (a view / identity)
    anything else                                           -> the layer's own forward

The layer list stays the source of truth: a plan only reads it (stages.py, no device). Stages
read and write numbered values, one device buffer each. Each kernel is generated for its layer
(shapes and constants as -D defines) by one of the kernel families, each a module next to its .cl
source, owning its block sizes, build options, weight packing and argument order:

    conv_gpu   local-memory implicit GEMM, split-K when tiles are few (GPUs; generic CPU shapes)
    conv_wino  CPU Winograd F(2x2 or 4x4, 3x3) for 3x3 stride-1 convolutions
    conv_cpu   CPU explicit-vector direct convolution otherwise (and depthwise, one channel each)
    conv_dw    depthwise convolution, one work-item per output (GPUs; CPU shapes conv_cpu does not take)
    linear     [LayerNorm +] Linear + activation, along the last or an inner axis
    seq        LayerNorm, the attention core (online over the keys), the mean over an axis, Transpose
    eltwise    the residual add no epilogue took; a Concat branch's copy into its slice
    cols       the column route of Conv1d and of Conv2d of unlike height and width geometry (the
               layers' im2col and GEMM through netcl.ops, run per call as a layer is), BN folded

Every conv family's epilogue (kernels/conv.h): bias (BN folded), activation, then the residual add
and the activation after the block, written with a stored zero border and a channel offset.

Tuning knobs (NETCL_JIT_CLASS, NETCL_GPU_SPLIT, NETCL_CPU_CONV, NETCL_CPU_WINO,
NETCL_CPU_WINO_BLOCK) are one JitConfig (config.py), read when an executable is made.

Device state is made on the first call for a given (queue, input shape) and kept, within bounds
(plan.py, executable.py): programs and folded weights per input shape without the batch (the batch
size is a kernel argument, never a define, so a new batch size builds nothing), and per input
shape the kernels with their arguments already set and the intermediate buffers. Later calls of
that shape build nothing and allocate nothing but the output tensor (from the buffer pool): they
enqueue the launches and return without waiting. Folded weights are checked against the `version`
of every source tensor on each call and re-folded when any changed, so weights changed after
eval() (load_state_dict, an optimizer step) are never run stale. Inputs are checked as the layers
check them; a plan may be called from several threads (FusedPlan says how).
"""
from netcl.jit.common import STATS
from netcl.jit.plan import FusedPlan, plan_fused

__all__ = ["plan_fused", "FusedPlan", "STATS"]
