"""Fused inference path (placeholder until the fused kernels land): no plan, so eval() runs
the unfused layers."""


def plan_fused(model):
    return None
