/*
 * mcp_mempool: a fixed-size-block memory pool over one aligned arena.
 *
 * Role: batch and receive buffers for the worker (DESIGN.md section 9). Reusing blocks avoids the page
 * faults that a fresh multi-MiB buffer costs on every batch, and one contiguous arena can be registered
 * with CUDA as pinned host memory in a single call (mcp_pool_base / mcp_pool_arena_bytes).
 *
 * Invariants:
 * - One arena per pool, allocated once at create and freed once at destroy; blocks never move.
 * - Block i starts at base + i * block_size; block_size is a multiple of the alignment, so every block is
 *   aligned. The arena's pages are touched at create, so the first use of a block does not fault.
 * - alloc and free are O(1): a stack of free block indices plus one in-use byte per block. The pool never
 *   writes into a block (no intrusive list), so a stray write into a freed block cannot corrupt the pool.
 * - Every pointer given to free is checked: inside the arena, at a block boundary, currently in use.
 * - Thread safety: every call except create/destroy may be made from any thread at once. A pthread mutex
 *   guards the free stack and the counters; the critical section is a few loads and stores, so the
 *   uncontended cost is one lock/unlock pair (~20 ns), and under contention threads sleep instead of
 *   spinning (a spinlock would burn the core that Python's other threads need). destroy must not race
 *   with any other call on the same pool.
 * - No global state: pools are independent.
 */
#ifndef MCP_MEMPOOL_H
#define MCP_MEMPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes of mcp_pool_free. */
#define MCP_POOL_OK 0
#define MCP_POOL_EFOREIGN (-1) /* NULL, outside the arena, or not at a block boundary */
#define MCP_POOL_EDOUBLE (-2)  /* the block is already free */

typedef struct mcp_pool mcp_pool;

/* A struct tag only: a typedef of the same name would clash with the function mcp_pool_stats. */
struct mcp_pool_stats {
    size_t block_size;      /* bytes per block, after rounding up to the alignment */
    size_t n_blocks;        /* blocks in the arena */
    size_t in_use;          /* blocks handed out and not yet freed */
    size_t high_water;      /* the most blocks ever in use at once */
    uint64_t failed_allocs; /* alloc calls that found the pool exhausted */
};

/*
 * A pool of n_blocks blocks of block_size bytes (rounded up to alignment). alignment must be 64 or 4096
 * (a cache line, or a page for CUDA host registration). Returns NULL with errno EINVAL for bad arguments
 * (zero sizes, another alignment, more than UINT32_MAX blocks, a size that overflows) or ENOMEM.
 */
mcp_pool *mcp_pool_create(size_t block_size, size_t n_blocks, size_t alignment);

/* A free block, or NULL when every block is in use (counted in failed_allocs). O(1). */
void *mcp_pool_alloc(mcp_pool *pool);

/* Return a block: MCP_POOL_OK, MCP_POOL_EFOREIGN or MCP_POOL_EDOUBLE (the pool is left unchanged). O(1). */
int mcp_pool_free(mcp_pool *pool, void *block);

/* A consistent snapshot of the counters. */
void mcp_pool_stats(const mcp_pool *pool, struct mcp_pool_stats *out);

/* The arena: its first byte and its length (block_size * n_blocks), e.g. for cuMemHostRegister. */
void *mcp_pool_base(const mcp_pool *pool);
size_t mcp_pool_arena_bytes(const mcp_pool *pool);

/* Free the arena and the pool. Blocks still in use become invalid. NULL is a no-op. */
void mcp_pool_destroy(mcp_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* MCP_MEMPOOL_H */
