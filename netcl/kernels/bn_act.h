// BatchNorm2d fused with the activation after it (training; norm.cl and norm_cpu.cl), built per
// activation: -DACT_KIND=<netcl.act.Act code> (act.h's selection folds to one formula: PoCL does
// not vectorise a run-time choice) and -DACT_OUT=1 where the activation differentiates through
// its output (netcl.act.Act.saves_output). The forward writes only y = act(z); the backward
// recomputes z (and act(z) where ACT_OUT) from x and the statistics instead of saving them, and
// takes dz = act'(.) * dy wherever BatchNorm's backward takes dy. ACT_NONE: plain BatchNorm, the
// arithmetic unchanged. The macros work on scalars and vectors alike.
#ifndef NETCL_BN_ACT_H
#define NETCL_BN_ACT_H

#ifndef ACT_KIND
#define ACT_KIND ACT_NONE
#endif
#ifndef ACT_OUT
#define ACT_OUT 0
#endif

// z = (x - mean) * invstd * gamma + beta, the one expression both passes use (the backward's
// recomputed z must round as the forward's did: relu's mask and the saved output depend on it)
#define BN_Z(x, m, inv, ga, be) (((x) - (m)) * (inv) * (ga) + (be))
// act(z): the forward pass's output (the element-wise pass, and the pooled one in pool_cpu.cl)
#define BN_ACT(x, m, inv, ga, be, slope) ACT_APPLY(ACT_KIND, BN_Z(x, m, inv, ga, be), slope)

#if ACT_KIND == ACT_NONE
#define BN_DZ(x, g, m, inv, ga, be, slope) (g)
#elif ACT_OUT
#define BN_DZ(x, g, m, inv, ga, be, slope) ACT_GRAD(ACT_KIND, ACT_APPLY(ACT_KIND, BN_Z(x, m, inv, ga, be), slope), g, slope)
#else
#define BN_DZ(x, g, m, inv, ga, be, slope) ACT_GRAD(ACT_KIND, BN_Z(x, m, inv, ga, be), g, slope)
#endif

#endif
