// Element-wise kernels used to check launches and argument passing of every scalar width.
#include "shimrt_portable.h"

// y = a * x + y (float32 scalar, int32 count)
SHIMRT_KERNEL void saxpy(float* y, const float* x, float a, int n) {
    for (shimrt_i64 i = shimrt_global_index(); i < n; i += shimrt_grid_stride())
        y[i] = a * x[i] + y[i];
}

// out = a + b on 64-bit integers (int64 count)
SHIMRT_KERNEL void add_i64(shimrt_i64* out, const shimrt_i64* a, const shimrt_i64* b, shimrt_i64 n) {
    for (shimrt_i64 i = shimrt_global_index(); i < n; i += shimrt_grid_stride())
        out[i] = a[i] + b[i];
}

// x = x * s + t on float64 (double scalars, unsigned 32-bit count)
SHIMRT_KERNEL void affine_f64(double* x, double s, double t, shimrt_u32 n) {
    for (shimrt_i64 i = shimrt_global_index(); i < n; i += shimrt_grid_stride())
        x[i] = x[i] * s + t;
}

// Does nothing: the launch-overhead benchmark times launches of it.
SHIMRT_KERNEL void empty(float* unused) {}
