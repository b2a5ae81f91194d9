// Bilinear upsampling's source coordinate, one definition for the layer's kernels (resize.cl)
// and the fused path's (seq.cl). align_corners=False: output index o reads source coordinate
// (o + 0.5) / s - 0.5, clamped at 0 (PyTorch's area_pixel_compute_source_index); lo = its floor,
// hi = lo + 1 except at the last row/column (hi = lo there), and f = its fraction is the weight of hi.
#ifndef NETCL_RESIZE_H
#define NETCL_RESIZE_H

inline void source(int o, float inv, int size, int *lo, int *hi, float *f) {
    float c = fmax((o + 0.5f) * inv - 0.5f, 0.0f);
    int l = (int)c;  // c >= 0: truncation is floor
    *lo = l;
    *hi = l < size - 1 ? l + 1 : l;
    *f = c - (float)l;
}

#endif
