"""netcl.nn: layers, Sequential and losses.

LAYERS is the registry of layer types that .netcl files can hold (by class name); the ONNX
exporter's EMITTERS table is checked against it (tests/test_layer_protocol.py)."""
from netcl.nn.activation import (ELU, GELU, Hardsigmoid, Hardswish, LeakyReLU, LogSoftmax, Mish, PReLU, ReLU, ReLU6,
                                 Sigmoid, SiLU, Softmax, Softplus, Tanh)
from netcl.nn.attention import MultiheadAttention
from netcl.nn.basic import Dropout, Flatten, Identity, Transpose
from netcl.nn.blocks import Concat, ModuleDict, ModuleList, Residual
from netcl.nn.conv import Conv2d, ConvTranspose2d
from netcl.nn.conv1d import Conv1d, ConvTranspose1d
from netcl.nn.embedding import Embedding
from netcl.nn.linear import Linear
from netcl.nn.loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss,
                           SmoothL1Loss)
from netcl.nn.graph import GraphModule, TraceError, trace
from netcl.nn.module import LAYERS, Module, Parameter, manual_seed
from netcl.nn.norm import BatchNorm1d, BatchNorm2d, GroupNorm, InstanceNorm1d, InstanceNorm2d, LayerNorm
from netcl.nn.pool import AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from netcl.nn.rnn import GRU, LSTM
from netcl.nn.sequential import Sequential
from netcl.nn.torch_import import from_torch
from netcl.nn.upsample import Upsample

LAYERS.update({cls.__name__: cls for cls in (Sequential, Linear, Conv2d, BatchNorm2d, ReLU, LeakyReLU, Sigmoid, Tanh,
                                        MaxPool2d, AvgPool2d, Identity, Flatten, Dropout, Softmax,
                                        MultiheadAttention, GELU, SiLU, ReLU6, Hardswish, Hardsigmoid, LayerNorm,
                                        Transpose, AdaptiveAvgPool2d, AdaptiveAvgPool1d, ConvTranspose2d, Residual,
                                        Concat, ModuleList, ModuleDict, GraphModule, Upsample,
                                        BatchNorm1d, Embedding, ELU, Softplus, Mish, PReLU, LogSoftmax,
                                        Conv1d, MaxPool1d, AvgPool1d, GroupNorm, InstanceNorm2d, ConvTranspose1d,
                                        InstanceNorm1d, LSTM, GRU)})

from netcl.nn import functional, utils  # noqa: E402  (after the layers it calls)

__all__ = ["Module", "Parameter", "ModuleDict", "GraphModule", "TraceError", "trace", "functional", "utils", "Sequential", "Linear", "Conv2d", "ConvTranspose2d", "BatchNorm2d", "LayerNorm", "ReLU",
           "LeakyReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "ReLU6", "Hardswish", "Hardsigmoid", "MaxPool2d",
           "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveAvgPool1d", "Upsample", "Identity", "Flatten", "Transpose",
           "Dropout", "Softmax", "MultiheadAttention", "Residual", "Concat", "ModuleList", "CrossEntropyLoss",
           "MSELoss", "BCELoss", "BCEWithLogitsLoss", "NLLLoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "LAYERS", "manual_seed", "from_torch",
           "BatchNorm1d", "Embedding", "ELU", "Softplus", "Mish", "PReLU", "LogSoftmax",
           "Conv1d", "MaxPool1d", "AvgPool1d", "GroupNorm", "InstanceNorm2d", "ConvTranspose1d",
           "InstanceNorm1d", "LSTM", "GRU"]
