// The cuda backend's kernels: the layer graph of model.yaml in FP32 (DESIGN section 9).
//
// Formulas and layouts are numpy_backend's (services/worker/mcp_worker/backends/numpy_backend.py):
//   mcp_dense_f32          y[M,N] = x[M,K] @ W[K,N] + b[N]   (W stored [in, out]; b may be NULL)
//   mcp_relu_f32           y = x < 0 ? 0 : x                (NaN passes through, as np.maximum)
//   mcp_gelu_f32           0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (the tanh approximation)
//   mcp_softmax_rows_f32   over the last axis, after subtracting the row maximum
//   mcp_layernorm_rows_f32 (x - mean) / sqrt(var + eps) * gamma + beta over the last axis, population
//                          variance; gamma and beta may each be NULL
//
// Launch contract (cuda_backend.py launches them; host_check.cpp emulates them on a CPU):
// - mcp_dense_f32: block (MCP_TILE, MCP_TILE), grid (ceil(N / MCP_TILE), ceil(M / MCP_TILE)). Any M, N, K
//   >= 1: every load and store is bounds-checked, and the tail of a tile reads zeros.
// - the row kernels: block (MCP_ROW_THREADS), any grid; block b handles rows b, b + gridDim.x, ...
// - the element-wise kernels: any block and grid; a grid-stride loop covers all n elements.
// - Every kernel but dense may run in place (x == y): each element is read and then written by the same
//   thread, and the row kernels finish all their reads of a row before a barrier that precedes the writes.
// - Indices into tensors are size_t, so a tensor may exceed 2^31 elements even though M, N, K are int.
//
// Only portable CUDA C is used (no warp intrinsics): host_check.cpp compiles this file as C++ with
// threads standing in for a block's threads, which checks the indexing and barriers without a GPU.

#ifndef MCP_TILE
#define MCP_TILE 16
#endif
#ifndef MCP_ROW_THREADS
#define MCP_ROW_THREADS 256  // a power of two: the block reductions halve it
#endif

extern "C" __global__ void mcp_dense_f32(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y, int m, int k,
                                         int n) {
    __shared__ float xs[MCP_TILE][MCP_TILE];
    __shared__ float ws[MCP_TILE][MCP_TILE];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * MCP_TILE + ty;
    const int col = blockIdx.x * MCP_TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += MCP_TILE) {
        const int kx = k0 + tx;  // the column of x this thread stages
        const int kw = k0 + ty;  // the row of W this thread stages
        xs[ty][tx] = (row < m && kx < k) ? x[(size_t)row * k + kx] : 0.0f;
        ws[ty][tx] = (kw < k && col < n) ? w[(size_t)kw * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MCP_TILE; ++i) {
            acc += xs[ty][i] * ws[i][tx];
        }
        __syncthreads();  // the next iteration overwrites the tiles
    }
    if (row < m && col < n) {
        y[(size_t)row * n + col] = b != nullptr ? acc + b[col] : acc;
    }
}

extern "C" __global__ void mcp_relu_f32(const float* x, float* y, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

extern "C" __global__ void mcp_gelu_f32(const float* x, float* y, long long n) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * (v * v * v))));
    }
}

// Reduce one value per thread over the block; every thread of the block must call it (it has barriers)
// and every thread gets the result. smem holds MCP_ROW_THREADS floats and is free again on return.
template <bool IsMax>
__device__ __forceinline__ float mcp_block_reduce(float v, float* smem) {
    const int t = threadIdx.x;
    smem[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            smem[t] = IsMax ? fmaxf(smem[t], smem[t + s]) : smem[t] + smem[t + s];
        }
        __syncthreads();
    }
    const float r = smem[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void mcp_softmax_rows_f32(const float* x, float* y, int rows, int cols) {
    __shared__ float smem[MCP_ROW_THREADS];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {  // r is the same for the whole block
        const float* xr = x + (size_t)r * cols;
        float* yr = y + (size_t)r * cols;
        float top = -INFINITY;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            top = fmaxf(top, xr[c]);
        }
        top = mcp_block_reduce<true>(top, smem);
        float sum = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            sum += expf(xr[c] - top);
        }
        sum = mcp_block_reduce<false>(sum, smem);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            yr[c] = expf(xr[c] - top) / sum;
        }
    }
}

extern "C" __global__ void mcp_layernorm_rows_f32(const float* x, float* y, const float* gamma,
                                                  const float* beta, int rows, int cols, float eps) {
    __shared__ float smem[MCP_ROW_THREADS];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (size_t)r * cols;
        float* yr = y + (size_t)r * cols;
        float sum = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            sum += xr[c];
        }
        const float mean = mcp_block_reduce<false>(sum, smem) / (float)cols;
        float sq = 0.0f;  // two passes, as numpy: the centred sum of squares loses nothing to cancellation
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float d = xr[c] - mean;
            sq += d * d;
        }
        const float denom = sqrtf(mcp_block_reduce<false>(sq, smem) / (float)cols + eps);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = (xr[c] - mean) / denom;
            if (gamma != nullptr) {
                v *= gamma[c];
            }
            if (beta != nullptr) {
                v += beta[c];
            }
            yr[c] = v;
        }
    }
}
