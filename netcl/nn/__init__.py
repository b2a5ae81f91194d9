"""netcl.nn: layers, Sequential and losses."""
from netcl.nn.layers import (LAYERS, AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, LeakyReLU, Linear, MaxPool2d,
                             Module, MultiheadAttention, ReLU, Sequential, Sigmoid, Softmax, Tanh, manual_seed)
from netcl.nn.loss import BCELoss, CrossEntropyLoss, MSELoss

__all__ = ["Module", "Sequential", "Linear", "Conv2d", "BatchNorm2d", "ReLU", "LeakyReLU", "Sigmoid", "Tanh",
           "MaxPool2d", "AvgPool2d", "Flatten", "Dropout", "Softmax", "MultiheadAttention", "CrossEntropyLoss",
           "MSELoss", "BCELoss", "LAYERS", "manual_seed"]
