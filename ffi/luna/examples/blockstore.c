/*
 * blockstore: a small block-storage frontend on luna's C ABI (inline mode).
 *
 * It serves 4 KiB block RPCs in knb's framing (examples/knb/src/proto.rs): a 16-byte
 * little-endian header `id u64 | len u32 | flags u16 | magic u16 = 0x6e6b`, then `len`
 * payload bytes.
 *
 *   WRITE  request with len = 4096: stores the payload in block (id % blocks). With the
 *          VERIFY flag every byte is checked against knb's pattern first
 *          (pattern_byte(id, SALT_REQ, off)); a mismatch aborts the connection.
 *          Reply: an empty RESPONSE (--write-reply ack), or the block read back from
 *          the store (--write-reply block, the default), as for a READ.
 *   READ   request with len = 0: returns block (id % blocks), 4096 bytes. A block
 *          written with VERIFY is returned re-keyed for the reader's id: each stored
 *          byte plus ((rid - wid) * 131 + SALT_RESP - SALT_REQ) mod 256, which turns
 *          the writer's pattern into pattern_byte(rid, SALT_RESP, off) exactly when the
 *          stored bytes are intact. So knb's stock client (`knb client --verify`)
 *          checks, byte for byte, data that went in, was stored and came back out.
 *          Reading a block never written is an error (the connection is aborted).
 *
 * Usage: blockstore CONFIG.toml [--set key=value]... [--port 7700] [--blocks 1024]
 *                   [--write-reply block|ack] [--conns N] [--lifetime SECONDS]
 * Stops after N connections have closed (--conns, default 1) or the lifetime
 * (default 60 s). Prints `BLOCKSTORE_READY` once serving and, at exit,
 * `BLOCKSTORE_RESULT writes=.. reads=.. replies=.. verified_bytes=.. errors=.. conns=..`
 * and `LUNA_STATS name=value ...` (core 0's counters). Exit status 0 when no error.
 */
#define _POSIX_C_SOURCE 200809L
#include "luna.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HDR_LEN 16
#define BLOCK 4096u
#define MAGIC 0x6e6b
#define F_RESPONSE 1
#define F_VERIFY 2
#define F_ALL 63
#define SALT_REQ 0x11
#define SALT_RESP 0x5a
#define MAX_SETS 32

static uint8_t pattern_byte(uint64_t id, uint64_t salt, uint32_t off) {
    return (uint8_t)((id * 131u + salt + off) & 0xff);
}

struct block {
    pthread_mutex_t mu;
    int valid;
    int verified;
    uint64_t writer;
    uint8_t data[BLOCK];
};

struct conn {
    uint8_t hdr[HDR_LEN];
    uint32_t hdr_got;
    int in_payload;
    uint64_t id;
    uint32_t len;
    uint16_t flags;
    uint32_t got;
    uint8_t stage[BLOCK];
};

struct app {
    uint16_t port;
    size_t nblocks;
    struct block *blocks;
    int readback;
    long conns_target;
    atomic_long conns_closed;
    atomic_long writes, reads, replies, verified_bytes, errors;
};

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void fail(struct app *a, const char *why, uint64_t id) {
    fprintf(stderr, "blockstore: %s (request %llu)\n", why, (unsigned long long)id);
    atomic_fetch_add(&a->errors, 1);
}

static void conn_done(luna_ctx_t *ctx, struct app *a, struct conn *c) {
    free(c);
    long n = atomic_fetch_add(&a->conns_closed, 1) + 1;
    if (n >= a->conns_target) luna_ctx_request_stop(ctx);
}

/* Sends the header, then (with_block) block b's 4096 bytes re-keyed for reader `id`. */
static int reply(luna_ctx_t *ctx, luna_conn_t conn, struct app *a, uint64_t id,
                 uint16_t flags, int with_block) {
    uint32_t len = with_block ? BLOCK : 0;
    luna_zbuf_mut_t *m = luna_ctx_alloc(ctx, HDR_LEN + len);
    if (!m) { fail(a, luna_last_error(), id); return -1; }
    uint8_t *h = luna_zbuf_mut_extend(m, HDR_LEN);
    if (!h) { luna_zbuf_mut_free(m); fail(a, luna_last_error(), id); return -1; }
    put(h, id, 8);
    put(h + 8, len, 4);
    put(h + 12, F_RESPONSE | (flags & F_VERIFY), 2);
    put(h + 14, MAGIC, 2);
    if (with_block) {
        struct block *b = &a->blocks[id % a->nblocks];
        uint8_t *out = luna_zbuf_mut_extend(m, BLOCK);
        if (!out) { luna_zbuf_mut_free(m); fail(a, luna_last_error(), id); return -1; }
        pthread_mutex_lock(&b->mu);
        int valid = b->valid, verified = b->verified;
        if (valid && verified) {
            uint8_t delta = (uint8_t)(((id - b->writer) * 131u + SALT_RESP - SALT_REQ) & 0xff);
            for (uint32_t i = 0; i < BLOCK; i++) out[i] = (uint8_t)(b->data[i] + delta);
        } else if (valid) {
            memcpy(out, b->data, BLOCK);
        }
        pthread_mutex_unlock(&b->mu);
        if (!valid || ((flags & F_VERIFY) && !verified)) {
            luna_zbuf_mut_free(m);
            fail(a, valid ? "verified read of a block written without VERIFY"
                          : "read of a block never written", id);
            return -1;
        }
    }
    luna_zbuf_t *z = luna_zbuf_freeze(m);
    if (!z) { fail(a, luna_last_error(), id); return -1; }
    int rc = luna_send_all(ctx, conn, z);
    luna_zbuf_free(z);
    if (rc != 0) {
        /* EAGAIN: the runtime's backlog (runtime.max_backlog) is full: knb's closed
         * loop never gets there; a real frontend would stop reading until writable. */
        fail(a, luna_last_error(), id);
        return -1;
    }
    atomic_fetch_add(&a->replies, 1);
    return 0;
}

/* A whole request arrived. */
static int complete(luna_ctx_t *ctx, luna_conn_t conn, struct app *a, struct conn *c) {
    if (c->len == BLOCK) {
        struct block *b = &a->blocks[c->id % a->nblocks];
        pthread_mutex_lock(&b->mu);
        memcpy(b->data, c->stage, BLOCK);
        b->writer = c->id;
        b->valid = 1;
        b->verified = (c->flags & F_VERIFY) != 0;
        pthread_mutex_unlock(&b->mu);
        atomic_fetch_add(&a->writes, 1);
        return reply(ctx, conn, a, c->id, c->flags, a->readback);
    }
    atomic_fetch_add(&a->reads, 1);
    return reply(ctx, conn, a, c->id, c->flags, 1);
}

/* Feeds received bytes through the parser; -1 on a protocol error. */
static int feed(luna_ctx_t *ctx, luna_conn_t conn, struct app *a, struct conn *c,
                const uint8_t *p, size_t n) {
    while (n > 0) {
        if (!c->in_payload) {
            size_t k = HDR_LEN - c->hdr_got;
            if (k > n) k = n;
            memcpy(c->hdr + c->hdr_got, p, k);
            c->hdr_got += (uint32_t)k;
            p += k;
            n -= k;
            if (c->hdr_got < HDR_LEN) return 0;
            c->hdr_got = 0;
            c->id = get64(c->hdr);
            c->len = get32(c->hdr + 8);
            c->flags = get16(c->hdr + 12);
            if (get16(c->hdr + 14) != MAGIC) { fail(a, "bad magic", c->id); return -1; }
            if (c->flags & ~F_ALL) { fail(a, "unknown flags", c->id); return -1; }
            if (c->flags & ~F_VERIFY) {
                fail(a, "unsupported flags (a response, bulk or service request)", c->id);
                return -1;
            }
            if (c->len != 0 && c->len != BLOCK) {
                fail(a, "length is neither 0 (read) nor 4096 (write)", c->id);
                return -1;
            }
            c->got = 0;
            if (c->len == 0) {
                if (complete(ctx, conn, a, c) != 0) return -1;
                continue;
            }
            c->in_payload = 1;
        }
        size_t k = c->len - c->got;
        if (k > n) k = n;
        if (c->flags & F_VERIFY) {
            for (size_t i = 0; i < k; i++) {
                if (p[i] != pattern_byte(c->id, SALT_REQ, c->got + (uint32_t)i)) {
                    fail(a, "write payload does not match the VERIFY pattern", c->id);
                    return -1;
                }
            }
            atomic_fetch_add(&a->verified_bytes, (long)k);
        }
        memcpy(c->stage + c->got, p, k);
        c->got += (uint32_t)k;
        p += k;
        n -= k;
        if (c->got == c->len) {
            c->in_payload = 0;
            if (complete(ctx, conn, a, c) != 0) return -1;
        }
    }
    return 0;
}

static void on_start(luna_ctx_t *ctx, void *user) {
    struct app *a = user;
    if (luna_listen(ctx, a->port, 1024, NULL) != 0) {
        fprintf(stderr, "blockstore: listen %u: %s\n", a->port, luna_last_error());
        atomic_fetch_add(&a->errors, 1);
        luna_ctx_request_stop(ctx);
    }
}

static void on_accept(luna_ctx_t *ctx, luna_conn_t conn, luna_listener_t l, void *user) {
    (void)l;
    struct app *a = user;
    struct conn *c = calloc(1, sizeof *c);
    if (!c || luna_conn_set_user(ctx, conn, c) != 0) {
        free(c);
        fail(a, "out of memory for a connection", 0);
        luna_abort(ctx, conn);
    }
}

static void on_readable(luna_ctx_t *ctx, luna_conn_t conn, void *user) {
    struct app *a = user;
    struct conn *c = luna_conn_user(ctx, conn);
    if (!c) return;
    for (;;) {
        luna_zbuf_t *z = NULL;
        ptrdiff_t n = luna_recv(ctx, conn, &z);
        if (n > 0) {
            int rc = feed(ctx, conn, a, c, luna_zbuf_data(z), (size_t)n);
            luna_zbuf_free(z);
            if (rc != 0) {
                luna_abort(ctx, conn);
                conn_done(ctx, a, c);
                return;
            }
            continue;
        }
        if (n == 0) { /* end of stream: the client is done */
            if (c->hdr_got || c->in_payload) fail(a, "stream ended inside a request", c->id);
            luna_close(ctx, conn);
            conn_done(ctx, a, c);
            return;
        }
        if (errno != EAGAIN) /* ECONNRESET: on_closed follows */
            fprintf(stderr, "blockstore: recv: %s\n", luna_last_error());
        return;
    }
}

static void on_closed(luna_ctx_t *ctx, luna_conn_t conn, int reason, void *user) {
    struct app *a = user;
    struct conn *c = luna_conn_user(ctx, conn);
    if (reason != 0) fprintf(stderr, "blockstore: connection closed: %s\n", strerror(reason));
    if (c) conn_done(ctx, a, c);
}

static void usage(const char *me) {
    fprintf(stderr,
            "usage: %s CONFIG.toml [--set key=value]... [--port 7700] [--blocks 1024]\n"
            "       [--write-reply block|ack] [--conns N] [--lifetime SECONDS]\n",
            me);
    exit(2);
}

int main(int argc, char **argv) {
    static struct app a;
    const char *sets[MAX_SETS];
    size_t nsets = 0;
    double lifetime = 60;
    a.port = 7700;
    a.nblocks = 1024;
    a.readback = 1;
    a.conns_target = 1;
    if (argc < 2) usage(argv[0]);
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage(argv[0]);
        i++;
        if (!strcmp(k, "--set") && nsets < MAX_SETS) sets[nsets++] = v;
        else if (!strcmp(k, "--port")) a.port = (uint16_t)atoi(v);
        else if (!strcmp(k, "--blocks")) a.nblocks = (size_t)atol(v);
        else if (!strcmp(k, "--write-reply")) a.readback = !strcmp(v, "block");
        else if (!strcmp(k, "--conns")) a.conns_target = atol(v);
        else if (!strcmp(k, "--lifetime")) lifetime = atof(v);
        else usage(argv[0]);
    }
    if (a.nblocks == 0 || a.port == 0 || a.conns_target < 1) usage(argv[0]);
    a.blocks = calloc(a.nblocks, sizeof *a.blocks);
    if (!a.blocks) { perror("blocks"); return 1; }
    for (size_t i = 0; i < a.nblocks; i++) pthread_mutex_init(&a.blocks[i].mu, NULL);

    luna_env_t *env = luna_init(argv[1], sets, nsets);
    if (!env) {
        fprintf(stderr, "blockstore: luna_init: %s (errno %d: %s)\n", luna_last_error(), errno,
                strerror(errno));
        return 1;
    }
    luna_inline_ops_t ops = {0};
    ops.on_start = on_start;
    ops.on_accept = on_accept;
    ops.on_readable = on_readable;
    ops.on_closed = on_closed;
    luna_runtime_t *rt = luna_run_inline(env, &ops, &a);
    if (!rt) {
        fprintf(stderr, "blockstore: luna_run_inline: %s\n", luna_last_error());
        luna_env_free(env);
        return 1;
    }
    printf("BLOCKSTORE_READY cores=%d port=%u blocks=%zu\n", luna_runtime_cores(rt), a.port,
           a.nblocks);
    fflush(stdout);
    struct timespec t0, now, tick = {0, 5 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (luna_runtime_finished(rt) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 > lifetime) {
            fprintf(stderr, "blockstore: lifetime of %.0f s reached: stopping\n", lifetime);
            atomic_fetch_add(&a.errors, 1);
            break;
        }
        nanosleep(&tick, NULL);
    }
    luna_runtime_stop(rt);
    int rc = luna_runtime_join(rt);
    if (rc != 0) {
        fprintf(stderr, "blockstore: luna_runtime_join: %s\n", luna_last_error());
        atomic_fetch_add(&a.errors, 1);
    }
    printf("BLOCKSTORE_RESULT writes=%ld reads=%ld replies=%ld verified_bytes=%ld errors=%ld "
           "conns=%ld\n",
           atomic_load(&a.writes), atomic_load(&a.reads), atomic_load(&a.replies),
           atomic_load(&a.verified_bytes), atomic_load(&a.errors), atomic_load(&a.conns_closed));
    size_t n = luna_stats_count();
    uint64_t *vals = calloc(n, sizeof *vals);
    if (vals && luna_runtime_stats_values(rt, 0, vals, n) == (int)n) {
        printf("LUNA_STATS");
        for (size_t i = 0; i < n; i++) printf(" %s=%llu", luna_stats_name(i), (unsigned long long)vals[i]);
        printf("\n");
    }
    luna_core_stats_t st;
    if (luna_runtime_stats(rt, 0, &st, sizeof st) == 0)
        printf("LUNA_CORE0 accepted=%llu rx_frames=%llu tx_frames=%llu stopped=%llu\n",
               (unsigned long long)st.accepted, (unsigned long long)st.rx_frames,
               (unsigned long long)st.tx_frames, (unsigned long long)st.stopped);
    free(vals);
    luna_runtime_free(rt);
    luna_env_free(env);
    return atomic_load(&a.errors) == 0 ? 0 : 1;
}
