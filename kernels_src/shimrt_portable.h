// shimrt_portable.h: one spelling for what differs between CUDA (NVRTC) and HIP (hipRTC).
// Include it first in every kernel source. No system headers: neither run-time compiler
// promises a C++ standard library.
#pragma once

#if defined(__HIPCC_RTC__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define SHIMRT_HIP 1
#else
#define SHIMRT_CUDA 1
#endif

typedef unsigned int shimrt_u32;
typedef unsigned long long shimrt_u64;
typedef long long shimrt_i64;

// C linkage: the loader finds kernels by their plain names.
#define SHIMRT_KERNEL extern "C" __global__
#define SHIMRT_KERNEL_BOUNDS(max_threads) extern "C" __global__ __launch_bounds__(max_threads)

// Dynamic shared memory (LDS), 16-byte aligned so any element type can be used.
#define SHIMRT_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]

#if defined(SHIMRT_CUDA)

#define SHIMRT_WARP_SIZE 32
// Nanoseconds since an arbitrary epoch, the same on every SM of the device.
static __device__ __forceinline__ shimrt_u64 shimrt_timestamp() {
    shimrt_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Index of the SM this thread runs on.
static __device__ __forceinline__ shimrt_u32 shimrt_sm_id() {
    shimrt_u32 id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
// Let the warp sleep for about ``ns`` nanoseconds (sm_70+), leaving its issue slots to others.
static __device__ __forceinline__ void shimrt_sleep(shimrt_u32 ns) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    __nanosleep(ns);
#endif
}

#else  // HIP

#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define SHIMRT_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define SHIMRT_WARP_SIZE 64
#endif
// Ticks of the constant-rate wall clock (hipDeviceAttributeWallClockRate kHz), shared by all CUs.
static __device__ __forceinline__ shimrt_u64 shimrt_timestamp() { return wall_clock64(); }
// Index of the compute unit this thread runs on (HIP packs XCC, SE and CU ids).
static __device__ __forceinline__ shimrt_u32 shimrt_sm_id() { return __smid(); }
// Let the wave sleep a while (s_sleep 127: the longest, about 8000 cycles), leaving its issue
// slots to others; callers loop on the clock, so the exact length does not matter.
static __device__ __forceinline__ void shimrt_sleep(shimrt_u32 ns) {
    (void)ns;
    __builtin_amdgcn_s_sleep(127);
}

#endif

// Global linear thread index and grid-stride step (1-D launches).
static __device__ __forceinline__ shimrt_i64 shimrt_global_index() {
    return (shimrt_i64)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ shimrt_i64 shimrt_grid_stride() {
    return (shimrt_i64)gridDim.x * blockDim.x;
}

// Per-block timelines for the overlap engine: ``stamps`` (nullable) holds 3 words per block:
// start, end (shimrt_timestamp units) and the SM (CU) id. Call shimrt_block_begin first thing
// and shimrt_block_end last, from every thread (it synchronises the block), never after an
// early return.
static __device__ __forceinline__ shimrt_u64 shimrt_block_begin(shimrt_u64* stamps) {
    return stamps ? shimrt_timestamp() : 0;
}
static __device__ __forceinline__ void shimrt_block_end(shimrt_u64* stamps, shimrt_u64 begin) {
    if (!stamps) return;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        shimrt_u64 b = blockIdx.x + (shimrt_u64)gridDim.x * (blockIdx.y + (shimrt_u64)gridDim.y * blockIdx.z);
        stamps[3 * b] = begin;
        stamps[3 * b + 1] = shimrt_timestamp();
        stamps[3 * b + 2] = shimrt_sm_id();
    }
}
