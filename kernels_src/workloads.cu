// Compute workloads for the overlap engine: a register-tiled SGEMM and three memory-bound
// kernels (bias + GELU, row softmax, row layernorm), float32, row-major.
//
// Every kernel takes a trailing ``stamps`` (nullable; 3 words per block, see
// shimrt_block_begin) and uses static shared memory only: the overlap engine adds dynamic
// shared memory purely as padding that caps how many blocks fit per SM. No thread returns
// early, so shimrt_block_end (which synchronises the block) is reached by all of them.
#include "shimrt_portable.h"

// --- SGEMM ---------------------------------------------------------------------------------
// C = alpha * A @ B + beta * C with A (M x K), B (K x N), C (M x N). Each block computes a
// 128 x 128 tile of C from 128 x 8 slices of A and 8 x 128 slices of B, double-buffered in
// shared memory: the next slices are fetched into registers while the current ones are used,
// so one barrier per slice suffices. Each of the 256 threads accumulates an 8 x 8 sub-tile made
// of four 4 x 4 pieces 64 rows / columns apart, so its shared-memory reads are float4s that a
// warp mostly shares (A) or reads contiguously (B), and its float4 stores of C coalesce.
// Requires M and N multiples of 128, K a multiple of 8, 16-byte aligned pointers and a grid of
// (N / 128, M / 128) blocks (blocks beyond the matrix do nothing).
#define SGEMM_BM 128
#define SGEMM_BN 128
#define SGEMM_BK 8
// The A slice is stored transposed (k-major) so a thread reads its 8 rows as two float4s. The
// padding puts the two k halves a thread row writes into different banks.
#define SGEMM_A_STRIDE (SGEMM_BM + 4)

#if defined(SHIMRT_CUDA)
// At most 128 registers per thread, so that two blocks of 256 threads fit on an SM.
#define SGEMM_BOUNDS 256, 2
#else
// HIP reads a second launch-bounds argument differently (waves per EU); 256 threads suffice.
#define SGEMM_BOUNDS 256
#endif

SHIMRT_KERNEL_BOUNDS(SGEMM_BOUNDS) void sgemm(float* C, const float* A, const float* B, int M, int N, int K,
                                              float alpha, float beta, shimrt_u64* stamps) {
    const shimrt_u64 t0 = shimrt_block_begin(stamps);
    __shared__ __align__(16) float As[2][SGEMM_BK][SGEMM_A_STRIDE];
    __shared__ __align__(16) float Bs[2][SGEMM_BK][SGEMM_BN];

    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;        // sub-tile: rows ty*4 (+64), columns tx*4 (+64)
    const int a_row = tid / 2, a_k = (tid % 2) * 4;  // this thread's float4 of the A slice
    const int b_k = tid / 32, b_col = (tid % 32) * 4; // and of the B slice
    const int row0 = blockIdx.y * SGEMM_BM, col0 = blockIdx.x * SGEMM_BN;

    if (row0 < M && col0 < N) {
        const float* a_src = A + (shimrt_i64)(row0 + a_row) * K + a_k;
        const float* b_src = B + (shimrt_i64)b_k * N + col0 + b_col;
        const shimrt_i64 b_step = (shimrt_i64)SGEMM_BK * N;
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

        float4 a_next = *(const float4*)a_src;
        float4 b_next = *(const float4*)b_src;
        As[0][a_k + 0][a_row] = a_next.x;
        As[0][a_k + 1][a_row] = a_next.y;
        As[0][a_k + 2][a_row] = a_next.z;
        As[0][a_k + 3][a_row] = a_next.w;
        *(float4*)&Bs[0][b_k][b_col] = b_next;
        __syncthreads();

        int buf = 0;
        for (int k0 = 0; k0 < K; k0 += SGEMM_BK) {
            const bool more = k0 + SGEMM_BK < K;
            if (more) {  // in flight while this slice is multiplied
                a_src += SGEMM_BK;
                b_src += b_step;
                a_next = *(const float4*)a_src;
                b_next = *(const float4*)b_src;
            }
#pragma unroll
            for (int kk = 0; kk < SGEMM_BK; ++kk) {
                const float4 a0 = *(const float4*)&As[buf][kk][ty * 4];
                const float4 a1 = *(const float4*)&As[buf][kk][ty * 4 + 64];
                const float4 b0 = *(const float4*)&Bs[buf][kk][tx * 4];
                const float4 b1 = *(const float4*)&Bs[buf][kk][tx * 4 + 64];
                const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            if (more) {  // the other buffer was last read before the previous barrier
                const int nb = buf ^ 1;
                As[nb][a_k + 0][a_row] = a_next.x;
                As[nb][a_k + 1][a_row] = a_next.y;
                As[nb][a_k + 2][a_row] = a_next.z;
                As[nb][a_k + 3][a_row] = a_next.w;
                *(float4*)&Bs[nb][b_k][b_col] = b_next;
            }
            __syncthreads();
            buf ^= 1;
        }

#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int row = row0 + ty * 4 + (i % 4) + (i / 4) * 64;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float4* dst = (float4*)(C + (shimrt_i64)row * N + col0 + tx * 4 + h * 64);
                float4 out;
                out.x = alpha * acc[i][h * 4 + 0];
                out.y = alpha * acc[i][h * 4 + 1];
                out.z = alpha * acc[i][h * 4 + 2];
                out.w = alpha * acc[i][h * 4 + 3];
                if (beta != 0.0f) {  // C is not read when beta is 0: it may hold anything, NaN too
                    const float4 old = *dst;
                    out.x = fmaf(beta, old.x, out.x);
                    out.y = fmaf(beta, old.y, out.y);
                    out.z = fmaf(beta, old.z, out.z);
                    out.w = fmaf(beta, old.w, out.w);
                }
                *dst = out;
            }
        }
    }
    shimrt_block_end(stamps, t0);
}

// --- bias + GELU ---------------------------------------------------------------------------
// out[r, c] = gelu(x[r, c] + bias[c]) with GELU's tanh approximation:
// gelu(v) = 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))). Grid-stride: any grid size.
SHIMRT_KERNEL void bias_gelu(float* out, const float* x, const float* bias, int rows, int cols, shimrt_u64* stamps) {
    const shimrt_u64 t0 = shimrt_block_begin(stamps);
    const shimrt_i64 n = (shimrt_i64)rows * cols;
    for (shimrt_i64 i = shimrt_global_index(); i < n; i += shimrt_grid_stride()) {
        const float v = x[i] + bias[i % cols];
        const float t = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(t));
    }
    shimrt_block_end(stamps, t0);
}

// --- row reductions ------------------------------------------------------------------------
// Block-wide reductions through shared memory alone (warp shuffles are spelled differently by
// CUDA and HIP, and warps are 32 or 64 wide): a tree over the next power of two of blockDim.x.
// Every thread gets the result; ``lane`` is free again on return.
#define ROW_MAX_BLOCK 1024

struct RowSum { __device__ float operator()(float a, float b) const { return a + b; } };
struct RowMax { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <typename Op>
static __device__ __forceinline__ float row_reduce(float v, float* lane, Op op) {
    const int t = threadIdx.x, n = blockDim.x;
    lane[t] = v;
    __syncthreads();
    int width = 1;
    while (width < n) width <<= 1;
    for (int step = width / 2; step > 0; step >>= 1) {
        if (t < step && t + step < n) lane[t] = op(lane[t], lane[t + step]);
        __syncthreads();
    }
    const float result = lane[0];
    __syncthreads();
    return result;
}

static __device__ __forceinline__ float row_sum(float v, float* lane) { return row_reduce(v, lane, RowSum()); }
static __device__ __forceinline__ float row_max(float v, float* lane) { return row_reduce(v, lane, RowMax()); }

// out[r, :] = softmax(x[r, :]), numerically stable (the row's maximum is subtracted first).
// One block per row (blocks beyond ``rows`` do nothing); any cols, any block size up to 1024.
SHIMRT_KERNEL void softmax_rows(float* out, const float* x, int rows, int cols, shimrt_u64* stamps) {
    const shimrt_u64 t0 = shimrt_block_begin(stamps);
    __shared__ float lane[ROW_MAX_BLOCK];
    const int r = blockIdx.x;
    if (r < rows) {
        const float* src = x + (shimrt_i64)r * cols;
        float* dst = out + (shimrt_i64)r * cols;
        float top = -3.402823466e38f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) top = fmaxf(top, src[c]);
        top = row_max(top, lane);
        float sum = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(src[c] - top);
        const float scale = 1.0f / row_sum(sum, lane);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = expf(src[c] - top) * scale;
    }
    shimrt_block_end(stamps, t0);
}

// out[r, c] = (x[r, c] - mean_r) / sqrt(var_r + eps) * gamma[c] + beta[c], with the row's mean
// and biased variance (two passes: the variance sums squares of deviations, not of values).
// One block per row, as softmax_rows.
SHIMRT_KERNEL void layernorm_rows(float* out, const float* x, const float* gamma, const float* beta, int rows,
                                  int cols, float eps, shimrt_u64* stamps) {
    const shimrt_u64 t0 = shimrt_block_begin(stamps);
    __shared__ float lane[ROW_MAX_BLOCK];
    const int r = blockIdx.x;
    if (r < rows) {
        const float* src = x + (shimrt_i64)r * cols;
        float* dst = out + (shimrt_i64)r * cols;
        float sum = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += src[c];
        const float mean = row_sum(sum, lane) / cols;
        float squares = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float d = src[c] - mean;
            squares += d * d;
        }
        const float inv_std = 1.0f / sqrtf(row_sum(squares, lane) / cols + eps);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = (src[c] - mean) * inv_std * gamma[c] + beta[c];
    }
    shimrt_block_end(stamps, t0);
}
