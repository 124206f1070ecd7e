/*
 * Unit tests of mcp_mempool: exhaustion, reuse, alignment, double-free and foreign-pointer detection,
 * stats, and a multithreaded hammer that proves no block is ever handed to two owners at once.
 *
 * Each test_* function is one test; CHECK records a failure and carries on, so one run reports every
 * broken check. The last line is "N passed, M failed" (build.sh and tests/integration look for it), and
 * the exit status is non-zero when anything failed.
 */
#include "mcp_mempool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_check_failures;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__,     \
                    __func__, #cond);                                                \
            g_check_failures++;                                                      \
        }                                                                            \
    } while (0)

static void stats_of(const mcp_pool *pool, struct mcp_pool_stats *s) { mcp_pool_stats(pool, s); }

static void test_create_rejects_bad_arguments(void) {
    size_t bad_alignments[] = {0, 1, 32, 128, 65, 8192};
    for (size_t i = 0; i < sizeof(bad_alignments) / sizeof(bad_alignments[0]); i++) {
        errno = 0;
        CHECK(mcp_pool_create(64, 4, bad_alignments[i]) == NULL);
        CHECK(errno == EINVAL);
    }
    errno = 0;
    CHECK(mcp_pool_create(0, 4, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(mcp_pool_create(64, 0, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(mcp_pool_create(SIZE_MAX, 2, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(mcp_pool_create(SIZE_MAX / 2, 4, 4096) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(mcp_pool_create(64, (size_t)UINT32_MAX + 1, 64) == NULL && errno == EINVAL);
    /* NULL pools are tolerated everywhere. */
    mcp_pool_destroy(NULL);
    CHECK(mcp_pool_alloc(NULL) == NULL);
    int local = 0;
    CHECK(mcp_pool_free(NULL, &local) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_base(NULL) == NULL && mcp_pool_arena_bytes(NULL) == 0);
}

static void test_exhaustion_and_failed_count(void) {
    enum { N = 8 };
    mcp_pool *pool = mcp_pool_create(256, N, 64);
    CHECK(pool != NULL);
    void *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = mcp_pool_alloc(pool);
        CHECK(blocks[i] != NULL);
        for (int j = 0; j < i; j++) CHECK(blocks[i] != blocks[j]);
    }
    CHECK(mcp_pool_alloc(pool) == NULL);
    CHECK(mcp_pool_alloc(pool) == NULL);
    struct mcp_pool_stats s;
    stats_of(pool, &s);
    CHECK(s.in_use == N && s.high_water == N && s.failed_allocs == 2);
    for (int i = 0; i < N; i++) CHECK(mcp_pool_free(pool, blocks[i]) == MCP_POOL_OK);
    stats_of(pool, &s);
    CHECK(s.in_use == 0 && s.high_water == N && s.failed_allocs == 2);
    mcp_pool_destroy(pool);
}

static void test_free_then_reuse(void) {
    mcp_pool *pool = mcp_pool_create(1000, 4, 64);
    void *a = mcp_pool_alloc(pool), *b = mcp_pool_alloc(pool);
    CHECK(a == mcp_pool_base(pool)); /* a fresh pool hands out blocks in address order */
    CHECK(mcp_pool_free(pool, a) == MCP_POOL_OK);
    CHECK(mcp_pool_alloc(pool) == a); /* the most recently freed block comes back first */
    void *c = mcp_pool_alloc(pool), *d = mcp_pool_alloc(pool);
    CHECK(c != NULL && d != NULL && mcp_pool_alloc(pool) == NULL);
    CHECK(mcp_pool_free(pool, c) == MCP_POOL_OK);
    CHECK(mcp_pool_alloc(pool) == c); /* freeing makes room again after exhaustion */
    (void)b;
    mcp_pool_destroy(pool);
}

static void check_alignment(size_t requested, size_t n, size_t alignment) {
    mcp_pool *pool = mcp_pool_create(requested, n, alignment);
    CHECK(pool != NULL);
    struct mcp_pool_stats s;
    stats_of(pool, &s);
    size_t expected = (requested + alignment - 1) / alignment * alignment;
    CHECK(s.block_size == expected && s.n_blocks == n);
    CHECK(mcp_pool_arena_bytes(pool) == expected * n);
    CHECK((uintptr_t)mcp_pool_base(pool) % alignment == 0);
    unsigned char *base = mcp_pool_base(pool);
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = mcp_pool_alloc(pool);
        CHECK(p != NULL && (uintptr_t)p % alignment == 0);
        CHECK(p >= base && p + s.block_size <= base + mcp_pool_arena_bytes(pool));
        /* Fill the whole requested size: ASan/valgrind flag any block that overruns the arena. */
        memset(p, (int)(i & 0xff), requested);
    }
    /* No two blocks overlap: each still holds its own fill byte. */
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = base + i * s.block_size;
        CHECK(p[0] == (unsigned char)(i & 0xff) && p[requested - 1] == (unsigned char)(i & 0xff));
    }
    mcp_pool_destroy(pool);
}

static void test_alignment_of_every_block(void) {
    check_alignment(1, 16, 64);
    check_alignment(100, 33, 64);
    check_alignment(64, 10, 64);
    check_alignment(1, 5, 4096);
    check_alignment(5000, 7, 4096);
    check_alignment(1 << 20, 3, 4096);
}

static void test_fresh_arena_is_zeroed(void) {
    mcp_pool *pool = mcp_pool_create(4096, 4, 4096);
    const unsigned char *base = mcp_pool_base(pool);
    size_t nonzero = 0;
    for (size_t i = 0; i < mcp_pool_arena_bytes(pool); i++) nonzero += base[i] != 0;
    CHECK(nonzero == 0); /* memset at create: pages are touched (and deterministic) up front */
    mcp_pool_destroy(pool);
}

static void test_double_free_detected(void) {
    mcp_pool *pool = mcp_pool_create(128, 4, 64);
    void *a = mcp_pool_alloc(pool);
    void *b = mcp_pool_alloc(pool);
    CHECK(mcp_pool_free(pool, a) == MCP_POOL_OK);
    CHECK(mcp_pool_free(pool, a) == MCP_POOL_EDOUBLE);
    struct mcp_pool_stats s;
    stats_of(pool, &s);
    CHECK(s.in_use == 1); /* the rejected free changed nothing */
    /* A block that was never handed out is "already free" too. */
    unsigned char *never = (unsigned char *)mcp_pool_base(pool) + 3 * 128;
    CHECK(mcp_pool_free(pool, never) == MCP_POOL_EDOUBLE);
    /* The free stack was not corrupted: exactly 3 more blocks, all distinct, then exhaustion. */
    void *x = mcp_pool_alloc(pool), *y = mcp_pool_alloc(pool), *z = mcp_pool_alloc(pool);
    CHECK(x && y && z && x != y && y != z && x != z && x != b && y != b && z != b);
    CHECK(mcp_pool_alloc(pool) == NULL);
    mcp_pool_destroy(pool);
}

static void test_foreign_pointers_detected(void) {
    mcp_pool *pool = mcp_pool_create(128, 4, 64);
    mcp_pool *other = mcp_pool_create(128, 4, 64);
    unsigned char *base = mcp_pool_base(pool);
    void *a = mcp_pool_alloc(pool);
    CHECK(a == base);
    /* Inside the arena but not at a block boundary. */
    CHECK(mcp_pool_free(pool, base + 1) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(pool, base + 64) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(pool, base + 128 + 8) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(pool, base + 4 * 128 - 1) == MCP_POOL_EFOREIGN);
    /* Outside the arena: one past its end, the heap, the stack, another pool, NULL. */
    CHECK(mcp_pool_free(pool, base + 4 * 128) == MCP_POOL_EFOREIGN);
    void *heap = malloc(128);
    int on_stack = 0;
    CHECK(mcp_pool_free(pool, heap) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(pool, &on_stack) == MCP_POOL_EFOREIGN);
    void *theirs = mcp_pool_alloc(other);
    CHECK(mcp_pool_free(pool, theirs) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(other, a) == MCP_POOL_EFOREIGN);
    CHECK(mcp_pool_free(pool, NULL) == MCP_POOL_EFOREIGN);
    struct mcp_pool_stats s;
    stats_of(pool, &s);
    CHECK(s.in_use == 1);
    CHECK(mcp_pool_free(pool, a) == MCP_POOL_OK); /* the real block still frees normally */
    CHECK(mcp_pool_free(other, theirs) == MCP_POOL_OK);
    free(heap);
    mcp_pool_destroy(other);
    mcp_pool_destroy(pool);
}

static void test_stats_and_high_water(void) {
    mcp_pool *pool = mcp_pool_create(64, 10, 64);
    struct mcp_pool_stats s;
    stats_of(pool, &s);
    CHECK(s.block_size == 64 && s.n_blocks == 10 && s.in_use == 0 && s.high_water == 0);
    CHECK(s.failed_allocs == 0);
    void *held[5];
    for (int i = 0; i < 5; i++) held[i] = mcp_pool_alloc(pool);
    for (int i = 0; i < 3; i++) CHECK(mcp_pool_free(pool, held[i]) == MCP_POOL_OK);
    void *again = mcp_pool_alloc(pool);
    stats_of(pool, &s);
    CHECK(s.in_use == 3 && s.high_water == 5 && s.failed_allocs == 0);
    CHECK(mcp_pool_free(pool, again) == MCP_POOL_OK);
    CHECK(mcp_pool_free(pool, held[3]) == MCP_POOL_OK);
    CHECK(mcp_pool_free(pool, held[4]) == MCP_POOL_OK);
    stats_of(pool, &s);
    CHECK(s.in_use == 0 && s.high_water == 5);
    mcp_pool_stats(pool, NULL); /* tolerated */
    mcp_pool_destroy(pool);
}

/* -- multithreaded hammer ---------------------------------------------------------------------------- */

enum { HAMMER_THREADS = 4, HAMMER_ITERS = 100000, HAMMER_BLOCKS = 8, HAMMER_HOLD = 3 };

struct hammer {
    mcp_pool *pool;
    unsigned char *base;
    size_t block_size;
    atomic_int owner[HAMMER_BLOCKS]; /* -1 when free, else the id of the thread holding the block */
    atomic_long violations;
    atomic_long nulls;
};

struct hammer_arg {
    struct hammer *h;
    int id;
};

static void *hammer_thread(void *raw) {
    struct hammer_arg *arg = raw;
    struct hammer *h = arg->h;
    unsigned seed = (unsigned)arg->id * 2654435761u + 1;
    for (long it = 0; it < HAMMER_ITERS; it++) {
        seed = seed * 1103515245u + 12345u;
        int hold = 1 + (int)((seed >> 16) % HAMMER_HOLD);
        uint64_t *got[HAMMER_HOLD];
        int n = 0;
        for (int k = 0; k < hold; k++) {
            uint64_t *p = mcp_pool_alloc(h->pool);
            if (p == NULL) {
                atomic_fetch_add(&h->nulls, 1);
                continue;
            }
            size_t index = (size_t)((unsigned char *)p - h->base) / h->block_size;
            int expected = -1;
            if (!atomic_compare_exchange_strong(&h->owner[index], &expected, arg->id))
                atomic_fetch_add(&h->violations, 1); /* handed out while another thread held it */
            p[0] = ((uint64_t)arg->id << 32) | (uint64_t)it; /* the owner marker, in the block itself */
            got[n++] = p;
        }
        for (int k = 0; k < n; k++) {
            uint64_t *p = got[k];
            if (p[0] != (((uint64_t)arg->id << 32) | (uint64_t)it))
                atomic_fetch_add(&h->violations, 1); /* someone else wrote into our block */
            size_t index = (size_t)((unsigned char *)p - h->base) / h->block_size;
            int expected = arg->id;
            if (!atomic_compare_exchange_strong(&h->owner[index], &expected, -1))
                atomic_fetch_add(&h->violations, 1);
            if (mcp_pool_free(h->pool, p) != MCP_POOL_OK) atomic_fetch_add(&h->violations, 1);
        }
    }
    return NULL;
}

static void test_threads_never_share_a_block(void) {
    static struct hammer h; /* static: too large a frame for comfort under ASan */
    h.pool = mcp_pool_create(64, HAMMER_BLOCKS, 64);
    CHECK(h.pool != NULL);
    h.base = mcp_pool_base(h.pool);
    struct mcp_pool_stats s;
    stats_of(h.pool, &s);
    h.block_size = s.block_size;
    for (int i = 0; i < HAMMER_BLOCKS; i++) atomic_init(&h.owner[i], -1);
    atomic_init(&h.violations, 0);
    atomic_init(&h.nulls, 0);
    pthread_t threads[HAMMER_THREADS];
    struct hammer_arg args[HAMMER_THREADS];
    for (int t = 0; t < HAMMER_THREADS; t++) {
        args[t] = (struct hammer_arg){&h, t};
        CHECK(pthread_create(&threads[t], NULL, hammer_thread, &args[t]) == 0);
    }
    for (int t = 0; t < HAMMER_THREADS; t++) pthread_join(threads[t], NULL);
    stats_of(h.pool, &s);
    CHECK(atomic_load(&h.violations) == 0);
    CHECK(s.in_use == 0);
    CHECK(s.high_water <= HAMMER_BLOCKS);
    CHECK(s.failed_allocs == (uint64_t)atomic_load(&h.nulls)); /* every NULL was counted, no more */
    printf("hammer: %d threads x %d iterations, %ld exhausted allocs, high water %zu of %d\n",
           HAMMER_THREADS, HAMMER_ITERS, atomic_load(&h.nulls), s.high_water, HAMMER_BLOCKS);
    mcp_pool_destroy(h.pool);
}

int main(void) {
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"create_rejects_bad_arguments", test_create_rejects_bad_arguments},
        {"exhaustion_and_failed_count", test_exhaustion_and_failed_count},
        {"free_then_reuse", test_free_then_reuse},
        {"alignment_of_every_block", test_alignment_of_every_block},
        {"fresh_arena_is_zeroed", test_fresh_arena_is_zeroed},
        {"double_free_detected", test_double_free_detected},
        {"foreign_pointers_detected", test_foreign_pointers_detected},
        {"stats_and_high_water", test_stats_and_high_water},
        {"threads_never_share_a_block", test_threads_never_share_a_block},
    };
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        int before = g_check_failures;
        tests[i].fn();
        if (g_check_failures == before) {
            passed++;
        } else {
            failed++;
            printf("FAILED %s\n", tests[i].name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
