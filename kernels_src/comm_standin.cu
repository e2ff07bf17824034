// A communication stand-in for one GPU: a kernel with the footprint of NCCL's device kernels
// (96 registers per thread, ~21.5 KB static + 80.3 KB dynamic shared memory, 512-640 threads,
// one block per channel) whose blocks form a ring, as NCCL's channels do across GPUs: block b
// does step s only after block b-1 finished step s-1. A block that is not resident stalls every
// other one within a step, so the kernel makes progress only when all of its blocks are
// resident: beside a compute kernel that fills the SMs it meets NCCL's scheduling problem.
#include "shimrt_portable.h"

// float4 pairs each thread holds in registers per round trip: 10 x (input, output) x 4 = 80
// data registers, which with addresses and counters land on NCCL's 96 under -maxrregcount=96,
// a few bytes spilled (checked in tests; 8 pairs compile to 88-92). Every load of a round trip
// is issued before the first add, so a warp keeps 10 KiB in flight and the block copies at
// memory speed, not at one load latency per element: its rate comes from the link's pace, as
// NCCL's does, not from its thread count.
#define STANDIN_UNROLL 10
// NCCL's ncclShmemData on sm_90 is 21568 B; the stand-in keeps the same static size and uses it.
#define STANDIN_STATIC_SMEM 21568

// Each step every block adds ``chunk`` float4s of ``src`` into ``dst`` (one ring step of an
// all-reduce reducing its slice); src and dst hold steps x blocks x chunk float4s. ``flags``
// holds one counter per block, kept across launches:
// a launch passes ``base`` = the counters' value when it began (launch k: k * steps), so no
// reset is needed between launches. If a block waits longer than ``timeout_ns`` for its
// neighbour, it sets ``*error`` and the whole grid stops instead of hanging. ``step_ns`` paces
// the ring like a link of fixed bandwidth: a block's step lasts at least that long, its warps
// asleep at the barrier for the rest (0: as fast as the block can copy).
SHIMRT_KERNEL_BOUNDS(640) void comm_ring(const float4* src, float4* dst, int chunk, shimrt_u32* flags,
                        shimrt_u32 base, int steps, shimrt_u64 step_ns, shimrt_u64 timeout_ns,
                        shimrt_u32* error, shimrt_u64* stamps) {
    shimrt_u64 t0 = shimrt_block_begin(stamps);
    __shared__ float staging[STANDIN_STATIC_SMEM / 4 - 4];  // + abort_ring, padded: 21568 B in all
    SHIMRT_DYNAMIC_SMEM(float, dynamic_smem);
    __shared__ int abort_ring;
    const int b = blockIdx.x, g = gridDim.x, prev = (b + g - 1) % g;
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) abort_ring = 0;
    __syncthreads();
    for (int s = 0; s < steps; ++s) {
        if (s > 0 && tid == 0) {
            volatile shimrt_u32* f = flags;
            shimrt_u64 begin = shimrt_timestamp();
            while (f[prev] < base + (shimrt_u32)s) {
                if (shimrt_timestamp() - begin > timeout_ns || *(volatile shimrt_u32*)error) {
                    atomicExch(error, 1u);
                    abort_ring = 1;
                    break;
                }
                if (step_ns) shimrt_sleep(200);  // paced: waiting need not be eager
            }
        }
        __syncthreads();
        if (abort_ring) break;
        // The step's data is here (the neighbour is done): the link's time starts now.
        const shimrt_u64 step_start = step_ns && tid == 0 ? shimrt_timestamp() : 0;
        // Every (step, block) has its own slice, so the result is the same whatever the order.
        long long offset = ((long long)s * g + b) * chunk;
        const float4* in = src + offset;
        float4* out = dst + offset;
        for (int i = tid; i < chunk; i += nt * STANDIN_UNROLL) {
            float4 v[STANDIN_UNROLL], d[STANDIN_UNROLL];
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int u = 0; u < STANDIN_UNROLL; ++u) {
                const bool live = i + u * nt < chunk;
                v[u] = live ? in[i + u * nt] : zero;
                d[u] = live ? out[i + u * nt] : zero;
            }
#pragma unroll
            for (int u = 0; u < STANDIN_UNROLL; ++u) {
                if (i + u * nt < chunk) {
                    d[u].x += v[u].x; d[u].y += v[u].y; d[u].z += v[u].z; d[u].w += v[u].w;
                    out[i + u * nt] = d[u];
                }
            }
        }
        // Touch the shared memory NCCL would stage through, so the compiler keeps all of it.
        if (tid < 32) {
            volatile float* st = staging;
            const int n = STANDIN_STATIC_SMEM / 4 - 4;
            st[(s * 32 + tid) % n] = (float)s;
            dynamic_smem[tid] = st[(s * 32 + tid + 1) % n];
        }
        if (step_ns && tid == 0)  // the link's pace: the other warps sleep at the barrier below
            while (shimrt_timestamp() - step_start < step_ns) shimrt_sleep(1000);
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicExch(&flags[b], base + (shimrt_u32)s + 1);
    }
    shimrt_block_end(stamps, t0);
}
