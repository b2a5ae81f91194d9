// group_sum(part, v): the sum of v over a work-group of RED work-items (the includer's RED, a power
// of two; `part` RED floats of local memory), added by a fixed tree: the same order every launch.
#ifndef NETCL_GROUP_SUM_H
#define NETCL_GROUP_SUM_H
float group_sum(__local float *part, float v) {
    const int t = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    part[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RED / 2; w > 0; w >>= 1) {
        if (t < w) part[t] += part[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}
#endif
