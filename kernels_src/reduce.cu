// A block reduction with static shared memory and launch bounds (exercises both in the
// compiler's resource report).
#include "shimrt_portable.h"

#define SHIMRT_REDUCE_THREADS 256

// partial[b] = sum of in[i] over the elements block b visits (grid-stride), in float64.
SHIMRT_KERNEL_BOUNDS(SHIMRT_REDUCE_THREADS) void block_sum(double* partial, const float* in, int n) {
    __shared__ double lane[SHIMRT_REDUCE_THREADS];
    double acc = 0.0;
    for (shimrt_i64 i = shimrt_global_index(); i < n; i += shimrt_grid_stride()) acc += in[i];
    lane[threadIdx.x] = acc;
    __syncthreads();
    for (int step = blockDim.x / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) lane[threadIdx.x] += lane[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = lane[0];
}
