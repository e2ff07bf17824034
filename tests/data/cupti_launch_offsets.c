/* The launch-callback layouts shimrt reads, from the installed CUDA and CUPTI headers:
   offsetof and sizeof per field ("table name offset size"), the callback ids and constants, and
   example structs as hex ("bytes name HEX") for tests/test_trace.py to parse with
   shimrt.cuda.trace.read_launch. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#define __CUDA_API_VERSION_INTERNAL 1 /* generated_cuda_meta.h names the _v1 types cuda.h then declares */
#include "cuda.h"
#include "cupti_callbacks.h"
#include "cupti_driver_cbid.h"
#include "generated_cuda_meta.h"
#define F(table, type, ours, theirs) printf("%s %s %zu %zu\n", table, ours, offsetof(type, theirs), \
                                            sizeof(((type *)0)->theirs));
static void hex(const char *name, const void *p, size_t n) {
    printf("bytes %s ", name);
    for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
    printf("\n");
}
int main(void) {
    F("CALLBACK_DATA", CUpti_CallbackData, "site", callbackSite)
    F("CALLBACK_DATA", CUpti_CallbackData, "function_name", functionName)
    F("CALLBACK_DATA", CUpti_CallbackData, "params", functionParams)
    F("CALLBACK_DATA", CUpti_CallbackData, "symbol_name", symbolName)
    F("CALLBACK_DATA", CUpti_CallbackData, "context", context)
    F("CALLBACK_DATA", CUpti_CallbackData, "correlation_id", correlationId)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "f", f)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "grid_x", gridDimX)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "grid_y", gridDimY)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "grid_z", gridDimZ)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "block_x", blockDimX)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "block_y", blockDimY)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "block_z", blockDimZ)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "dynamic_smem", sharedMemBytes)
    F("LAUNCH_PARAMS", cuLaunchKernel_params, "stream", hStream)
    F("LAUNCH_PARAMS_PTSZ", cuLaunchKernel_ptsz_params, "dynamic_smem", sharedMemBytes)
    F("LAUNCH_EX_PARAMS", cuLaunchKernelEx_params, "config", config)
    F("LAUNCH_EX_PARAMS", cuLaunchKernelEx_params, "f", f)
    F("LAUNCH_EX_PARAMS_PTSZ", cuLaunchKernelEx_ptsz_params, "f", f)
    F("LAUNCH_CONFIG", CUlaunchConfig, "grid_x", gridDimX)
    F("LAUNCH_CONFIG", CUlaunchConfig, "grid_y", gridDimY)
    F("LAUNCH_CONFIG", CUlaunchConfig, "grid_z", gridDimZ)
    F("LAUNCH_CONFIG", CUlaunchConfig, "block_x", blockDimX)
    F("LAUNCH_CONFIG", CUlaunchConfig, "block_y", blockDimY)
    F("LAUNCH_CONFIG", CUlaunchConfig, "block_z", blockDimZ)
    F("LAUNCH_CONFIG", CUlaunchConfig, "dynamic_smem", sharedMemBytes)
    F("LAUNCH_CONFIG", CUlaunchConfig, "stream", hStream)
    F("LAUNCH_CONFIG", CUlaunchConfig, "attrs", attrs)
    F("LAUNCH_CONFIG", CUlaunchConfig, "num_attrs", numAttrs)
    F("LAUNCH_ATTRIBUTE", CUlaunchAttribute, "id", id)
    F("LAUNCH_ATTRIBUTE", CUlaunchAttribute, "cooperative", value.cooperative)
    F("LAUNCH_ATTRIBUTE", CUlaunchAttribute, "cluster_x", value.clusterDim.x)
    F("LAUNCH_ATTRIBUTE", CUlaunchAttribute, "cluster_y", value.clusterDim.y)
    F("LAUNCH_ATTRIBUTE", CUlaunchAttribute, "cluster_z", value.clusterDim.z)
    printf("LAUNCH_ATTRIBUTE size %zu 0\n", sizeof(CUlaunchAttribute));
    printf("CONST cuLaunchKernel %d\nCONST cuLaunchKernel_ptsz %d\nCONST cuLaunchKernelEx %d\n"
           "CONST cuLaunchKernelEx_ptsz %d\nCONST DRIVER_DOMAIN %d\nCONST API_ENTER %d\n"
           "CONST ATTRIBUTE_COOPERATIVE %d\nCONST ATTRIBUTE_CLUSTER %d\n",
           (int)CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, (int)CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
           (int)CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, (int)CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
           (int)CUPTI_CB_DOMAIN_DRIVER_API, (int)CUPTI_API_ENTER, (int)CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
           (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    printf("CONST cuGraphLaunch %d\nCONST cuGraphLaunch_ptsz %d\n", (int)CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
           (int)CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz);
    /* Examples: a plain launch, and an Ex launch with a cluster and the cooperative flag. */
    cuLaunchKernel_params p;
    memset(&p, 0, sizeof p);
    p.f = (CUfunction)0x1234; p.gridDimX = 1000; p.gridDimY = 2; p.gridDimZ = 1; p.blockDimX = 128;
    p.blockDimY = 2; p.blockDimZ = 1; p.sharedMemBytes = 4096; p.hStream = (CUstream)0x5678;
    hex("launch", &p, sizeof p);
    CUlaunchAttribute attrs[2];
    memset(attrs, 0, sizeof attrs);
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[0].value.clusterDim.x = 2; attrs[0].value.clusterDim.y = 1; attrs[0].value.clusterDim.z = 1;
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[1].value.cooperative = 1;
    hex("attrs", attrs, sizeof attrs);
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = 132; c.gridDimY = 1; c.gridDimZ = 1; c.blockDimX = 384; c.blockDimY = 1; c.blockDimZ = 1;
    c.sharedMemBytes = 188604; c.hStream = (CUstream)0x9abc; c.numAttrs = 2;
    hex("config", &c, sizeof c);
    return 0;
}
