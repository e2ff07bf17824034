// Probes of where and when blocks run: SM ids and device timestamps per block.
#include "shimrt_portable.h"

// Block b records the SM it ran on and its start and end time, spinning until at least
// `spin` timer ticks have passed, so that blocks overlap in time and residency can be measured.
SHIMRT_KERNEL void sm_probe(shimrt_u32* sm, shimrt_u64* start, shimrt_u64* stop, shimrt_u64 spin) {
    const shimrt_u64 t0 = shimrt_timestamp();
    if (threadIdx.x == 0) {
        shimrt_u64 t = t0;
        while (t - t0 < spin) t = shimrt_timestamp();
        sm[blockIdx.x] = shimrt_sm_id();
        start[blockIdx.x] = t0;
        stop[blockIdx.x] = t;
    }
    __syncthreads();
}
