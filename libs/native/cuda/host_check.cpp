// Run kernels.cu on a CPU, for tests on machines without a GPU (tests/unit/test_cuda_kernels_build.py).
//
// The kernels are compiled as plain C++: a thread per CUDA thread, a std::barrier for __syncthreads,
// `static` for __shared__ (blocks run one after another, so a block's threads share it and no two blocks
// overlap). This checks indexing, bounds, barriers and the reductions; it says nothing about speed, and a
// barrier that some threads of a block skip deadlocks here as it would misbehave on a GPU.
//
// Usage (tensors are raw little-endian float32 files; "-" for an absent optional tensor):
//   host_check dense M K N x.bin w.bin b.bin|- y.bin
//   host_check relu|gelu N x.bin y.bin                        (in place, a grid smaller than needed)
//   host_check softmax ROWS COLS x.bin y.bin                  (in place, fewer blocks than rows)
//   host_check layernorm ROWS COLS EPS x.bin gamma|- beta|- y.bin
// Build: g++ -std=c++20 -O1 -pthread -I libs/native/cuda libs/native/cuda/host_check.cpp

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static thread_local dim3 threadIdx;
static thread_local dim3 blockIdx;
static dim3 blockDim;
static dim3 gridDim;
static std::barrier<>* g_block_barrier = nullptr;

static void __syncthreads() { g_block_barrier->arrive_and_wait(); }

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#include "kernels.cu"

// One launch: the blocks in turn, each as blockDim threads that meet at __syncthreads.
static void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = block;
    const unsigned threads = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> barrier(threads);
                g_block_barrier = &barrier;
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (unsigned t = 0; t < threads; ++t) {
                    pool.emplace_back([&, t] {
                        blockIdx = {bx, by, bz};
                        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        kernel();
                    });
                }
                for (auto& th : pool) th.join();
            }
}

static std::vector<float> load(const char* path, size_t count) {
    std::vector<float> data(count);
    FILE* f = std::fopen(path, "rb");
    if (f == nullptr || std::fread(data.data(), sizeof(float), count, f) != count) {
        std::fprintf(stderr, "host_check: cannot read %zu floats from %s\n", count, path);
        std::exit(2);
    }
    std::fclose(f);
    return data;
}

static void save(const char* path, const std::vector<float>& data) {
    FILE* f = std::fopen(path, "wb");
    if (f == nullptr || std::fwrite(data.data(), sizeof(float), data.size(), f) != data.size()) {
        std::fprintf(stderr, "host_check: cannot write %s\n", path);
        std::exit(2);
    }
    std::fclose(f);
}

static bool absent(const char* path) { return std::strcmp(path, "-") == 0; }

static unsigned ceil_div(unsigned a, unsigned b) { return (a + b - 1) / b; }

int main(int argc, char** argv) {
    const std::string op = argc > 1 ? argv[1] : "";
    if (op == "dense" && argc == 9) {
        const int m = std::atoi(argv[2]), k = std::atoi(argv[3]), n = std::atoi(argv[4]);
        auto x = load(argv[5], (size_t)m * k);
        auto w = load(argv[6], (size_t)k * n);
        std::vector<float> b = absent(argv[7]) ? std::vector<float>() : load(argv[7], n);
        std::vector<float> y((size_t)m * n, NAN);
        const float* bp = b.empty() ? nullptr : b.data();
        launch({ceil_div(n, MCP_TILE), ceil_div(m, MCP_TILE), 1}, {MCP_TILE, MCP_TILE, 1},
               [&] { mcp_dense_f32(x.data(), w.data(), bp, y.data(), m, k, n); });
        save(argv[8], y);
    } else if ((op == "relu" || op == "gelu") && argc == 5) {
        const long long n = std::atoll(argv[2]);
        auto x = load(argv[3], n);
        auto kernel = op == "relu" ? mcp_relu_f32 : mcp_gelu_f32;
        launch({2, 1, 1}, {64, 1, 1}, [&] { kernel(x.data(), x.data(), n); });
        save(argv[4], x);
    } else if (op == "softmax" && argc == 6) {
        const int rows = std::atoi(argv[2]), cols = std::atoi(argv[3]);
        auto x = load(argv[4], (size_t)rows * cols);
        launch({rows > 3 ? 3u : (unsigned)rows, 1, 1}, {MCP_ROW_THREADS, 1, 1},
               [&] { mcp_softmax_rows_f32(x.data(), x.data(), rows, cols); });
        save(argv[5], x);
    } else if (op == "layernorm" && argc == 9) {
        const int rows = std::atoi(argv[2]), cols = std::atoi(argv[3]);
        const float eps = (float)std::atof(argv[4]);
        auto x = load(argv[5], (size_t)rows * cols);
        std::vector<float> g = absent(argv[6]) ? std::vector<float>() : load(argv[6], cols);
        std::vector<float> b = absent(argv[7]) ? std::vector<float>() : load(argv[7], cols);
        const float* gp = g.empty() ? nullptr : g.data();
        const float* bp = b.empty() ? nullptr : b.data();
        launch({rows > 3 ? 3u : (unsigned)rows, 1, 1}, {MCP_ROW_THREADS, 1, 1},
               [&] { mcp_layernorm_rows_f32(x.data(), x.data(), gp, bp, rows, cols, eps); });
        save(argv[8], x);
    } else {
        std::fprintf(stderr, "usage: see the header of host_check.cpp\n");
        return 2;
    }
    return 0;
}
