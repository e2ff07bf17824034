// Reference occupancy from NVIDIA's cuda_occupancy.h (the nvidia-cuda-runtime wheel), for
// tests/test_occupancy.py. Reads one case per line:
//   major minor maxThreadsPerBlock maxThreadsPerSM regsPerBlock regsPerSM warpSize
//   smemPerBlock smemPerSM smemPerBlockOptin reservedSmemPerBlock blockSize numRegs staticSmem dynamicSmem
// and prints "blocks limitWarps limitBlocks limitRegs limitSmem" (or "error N").
#include <cstdio>
#include "cuda_occupancy.h"

int main() {
    cudaOccDeviceProp p;
    int bs, regs;
    size_t stat, dyn;
    while (std::scanf("%d %d %d %d %d %d %d %zu %zu %zu %zu %d %d %zu %zu", &p.computeMajor, &p.computeMinor,
                      &p.maxThreadsPerBlock, &p.maxThreadsPerMultiprocessor, &p.regsPerBlock,
                      &p.regsPerMultiprocessor, &p.warpSize, &p.sharedMemPerBlock, &p.sharedMemPerMultiprocessor,
                      &p.sharedMemPerBlockOptin, &p.reservedSharedMemPerBlock, &bs, &regs, &stat, &dyn) == 15) {
        p.numSms = 1;  // not part of the per-SM answer, but must be positive
        cudaOccFuncAttributes a;
        a.maxThreadsPerBlock = p.maxThreadsPerBlock;
        a.numRegs = regs;
        a.sharedSizeBytes = stat;
        a.partitionedGCConfig = PARTITIONED_GC_OFF;
        // As shimrt launches: dynamic smem above the default limit is opted in, to exactly its size.
        a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
        a.maxDynamicSharedSizeBytes = dyn;
        a.numBlockBarriers = 0;
        a.virtualResourceCount = 0;
        cudaOccDeviceState s;
        cudaOccResult r;
        cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, bs, dyn);
        if (e != CUDA_OCC_SUCCESS) {
            std::printf("error %d\n", (int)e);
        } else {
            std::printf("%d %d %d %d %d\n", r.activeBlocksPerMultiprocessor, r.blockLimitWarps, r.blockLimitBlocks,
                        r.blockLimitRegs, r.blockLimitSharedMem);
        }
    }
    return 0;
}
