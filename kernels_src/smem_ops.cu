// Kernels that use all of their dynamic shared memory, to check large dynamic-smem launches.
#include "shimrt_portable.h"

// Each block stages its tile of `tile` floats in dynamic shared memory (tile * 4 bytes must be
// the launch's dynamic smem) and writes it back reversed within the tile:
// out[b*tile + j] = in[b*tile + tile-1-j]. Every byte of the dynamic allocation is written and read.
SHIMRT_KERNEL void reverse_tiles(float* out, const float* in, int tile) {
    SHIMRT_DYNAMIC_SMEM(float, stage);
    const shimrt_i64 base = (shimrt_i64)blockIdx.x * tile;
    for (int j = threadIdx.x; j < tile; j += blockDim.x) stage[j] = in[base + j];
    __syncthreads();
    for (int j = threadIdx.x; j < tile; j += blockDim.x) out[base + j] = stage[tile - 1 - j];
}
