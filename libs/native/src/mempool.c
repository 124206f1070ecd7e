/*
 * mcp_mempool: the implementation of include/mcp_mempool.h (read its header comment for the invariants).
 *
 * Layout: one metadata allocation (this struct, the free-index stack, the in-use bytes) and one aligned
 * arena. The arena is never written by the pool after create, so clients own every byte of their blocks.
 */
#define _GNU_SOURCE /* madvise(MADV_HUGEPAGE) */
#include "mcp_mempool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct mcp_pool {
    pthread_mutex_t lock; /* guards free_top, free_stack, in_use and the counters below */
    unsigned char *base;  /* immutable after create */
    size_t block_size;    /* immutable; a multiple of the alignment */
    size_t n_blocks;      /* immutable */
    size_t arena_bytes;   /* immutable: block_size * n_blocks */
    size_t free_top;      /* number of entries in free_stack */
    size_t high_water;
    uint64_t failed_allocs;
    uint32_t *free_stack;   /* indices of free blocks; the top is reused first (it is cache-warm) */
    unsigned char *in_use;  /* one byte per block: 1 while handed out */
};

static int valid_alignment(size_t alignment) { return alignment == 64 || alignment == 4096; }

/* Ask for transparent huge pages over the 2 MiB-aligned part of a large arena: 512x fewer page faults
 * when the arena is first touched. Advice only; failure (no THP, "never" policy) changes nothing. */
static void advise_huge_pages(unsigned char *base, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = ((uintptr_t)base + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)base + bytes) & ~(huge - 1);
    if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)base;
    (void)bytes;
#endif
}

mcp_pool *mcp_pool_create(size_t block_size, size_t n_blocks, size_t alignment) {
    if (block_size == 0 || n_blocks == 0 || n_blocks > UINT32_MAX || !valid_alignment(alignment) ||
        block_size > SIZE_MAX - (alignment - 1)) {
        errno = EINVAL;
        return NULL;
    }
    size_t rounded = (block_size + alignment - 1) & ~(alignment - 1);
    if (n_blocks > SIZE_MAX / rounded) {
        errno = EINVAL;
        return NULL;
    }
    size_t meta_bytes = sizeof(mcp_pool) + n_blocks * sizeof(uint32_t) + n_blocks;
    mcp_pool *pool = calloc(1, meta_bytes);
    if (pool == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pool->block_size = rounded;
    pool->n_blocks = n_blocks;
    pool->arena_bytes = rounded * n_blocks;
    pool->free_stack = (uint32_t *)(pool + 1);
    pool->in_use = (unsigned char *)(pool->free_stack + n_blocks);

    void *arena = NULL;
    int rc = posix_memalign(&arena, alignment, pool->arena_bytes);
    if (rc != 0) {
        free(pool);
        errno = rc;
        return NULL;
    }
    pool->base = arena;
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(arena);
        free(pool);
        errno = ENOMEM;
        return NULL;
    }
    advise_huge_pages(pool->base, pool->arena_bytes);
    /* Touch every page now (once, at startup) so no request pays the page faults later. */
    memset(pool->base, 0, pool->arena_bytes);
    /* Block 0 on top, so a fresh pool hands out blocks in address order. */
    for (size_t i = 0; i < n_blocks; i++) pool->free_stack[i] = (uint32_t)(n_blocks - 1 - i);
    pool->free_top = n_blocks;
    return pool;
}

void *mcp_pool_alloc(mcp_pool *pool) {
    if (pool == NULL) return NULL;
    void *block = NULL;
    pthread_mutex_lock(&pool->lock);
    if (pool->free_top == 0) {
        pool->failed_allocs++;
    } else {
        uint32_t index = pool->free_stack[--pool->free_top];
        pool->in_use[index] = 1;
        size_t in_use = pool->n_blocks - pool->free_top;
        if (in_use > pool->high_water) pool->high_water = in_use;
        block = pool->base + (size_t)index * pool->block_size;
    }
    pthread_mutex_unlock(&pool->lock);
    return block;
}

int mcp_pool_free(mcp_pool *pool, void *block) {
    if (pool == NULL || block == NULL) return MCP_POOL_EFOREIGN;
    /* base, block_size and arena_bytes never change, so the bounds check needs no lock. Compare as
     * integers: ordering unrelated pointers is undefined behaviour in C. */
    uintptr_t addr = (uintptr_t)block, base = (uintptr_t)pool->base;
    if (addr < base || addr - base >= pool->arena_bytes) return MCP_POOL_EFOREIGN;
    size_t offset = addr - base;
    if (offset % pool->block_size != 0) return MCP_POOL_EFOREIGN;
    size_t index = offset / pool->block_size;

    int rc = MCP_POOL_OK;
    pthread_mutex_lock(&pool->lock);
    if (!pool->in_use[index]) {
        rc = MCP_POOL_EDOUBLE;
    } else {
        pool->in_use[index] = 0;
        pool->free_stack[pool->free_top++] = (uint32_t)index;
    }
    pthread_mutex_unlock(&pool->lock);
    return rc;
}

void mcp_pool_stats(const mcp_pool *pool, struct mcp_pool_stats *out) {
    if (out == NULL) return;
    memset(out, 0, sizeof(*out));
    if (pool == NULL) return;
    /* The mutex is state of the lock, not of the pool's value: locking it does not break const. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&pool->lock;
    pthread_mutex_lock(lock);
    out->block_size = pool->block_size;
    out->n_blocks = pool->n_blocks;
    out->in_use = pool->n_blocks - pool->free_top;
    out->high_water = pool->high_water;
    out->failed_allocs = pool->failed_allocs;
    pthread_mutex_unlock(lock);
}

void *mcp_pool_base(const mcp_pool *pool) { return pool == NULL ? NULL : pool->base; }

size_t mcp_pool_arena_bytes(const mcp_pool *pool) { return pool == NULL ? 0 : pool->arena_bytes; }

void mcp_pool_destroy(mcp_pool *pool) {
    if (pool == NULL) return;
    pthread_mutex_destroy(&pool->lock);
    free(pool->base);
    free(pool);
}
