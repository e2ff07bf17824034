/* offsetof the CUpti_ActivityKernel10 fields shimrt reads, from the installed CUPTI header;
   tests/test_trace.py compares them with shimrt.cuda.trace.KERNEL_RECORD. */
#include <stddef.h>
#include <stdio.h>
#include "cupti_activity.h"
#define F(ours, theirs) printf("%s %zu %zu\n", ours, offsetof(CUpti_ActivityKernel10, theirs), \
                               sizeof(((CUpti_ActivityKernel10 *)0)->theirs));
int main(void) {
    F("kind", kind) F("registers", registersPerThread) F("start", start) F("end", end)
    F("device_id", deviceId) F("stream_id", streamId) F("grid_x", gridX) F("grid_y", gridY) F("grid_z", gridZ)
    F("block_x", blockX) F("block_y", blockY) F("block_z", blockZ) F("static_smem", staticSharedMemory)
    F("dynamic_smem", dynamicSharedMemory) F("local_per_thread", localMemoryPerThread) F("name", name)
    printf("KIND_KERNEL %d 0\nKIND_CONCURRENT_KERNEL %d 0\n", (int)CUPTI_ACTIVITY_KIND_KERNEL,
           (int)CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    return 0;
}
