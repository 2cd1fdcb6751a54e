/*
 * echo_batch: an epoll-style echo server on luna's batch API — the loop an epoll
 * program has, with socket/bind/listen/accept/recv/send/close/epoll_ctl/epoll_wait
 * replaced one for one by luna_sock_*. Bytes that send() does not take wait in a
 * per-socket buffer until the socket turns writable.
 *
 * Usage: echo_batch CONFIG.toml [--port 7000] [--conns N]
 * Stops after N connections have closed (default 1). Prints `ECHO_READY`, then
 * `ECHO_RESULT echoed=BYTES conns=N errors=E`.
 */
#define _POSIX_C_SOURCE 200809L
#include "luna.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_FDS 1024
#define BUF 65536

struct sock {
    uint8_t *pending; /* bytes send() did not take yet */
    size_t len;
    int eof; /* the peer finished: close once pending is out */
};

struct app {
    uint16_t port;
    long conns_target;
    int lfd;
    long conns_closed, errors;
    unsigned long long echoed;
    struct sock socks[MAX_FDS];
};

static void drop(luna_sockets_t *s, struct app *a, int fd) {
    if (fd >= 0 && fd < MAX_FDS) {
        free(a->socks[fd].pending);
        a->socks[fd].pending = NULL;
        a->socks[fd].len = 0;
        a->socks[fd].eof = 0;
    }
    luna_sock_close(s, fd);
    if (++a->conns_closed >= a->conns_target) luna_sock_request_stop(s);
}

/* Sends what is pending; 0 when all went out, 1 when some waits, -1 on error. */
static int flush(luna_sockets_t *s, struct sock *k, int fd) {
    while (k->len > 0) {
        ptrdiff_t n = luna_sock_send(s, fd, k->pending, k->len);
        if (n < 0) return errno == EAGAIN ? 1 : -1;
        memmove(k->pending, k->pending + n, k->len - (size_t)n);
        k->len -= (size_t)n;
    }
    return 0;
}

static void on_start(luna_sockets_t *s, void *user) {
    struct app *a = user;
    a->lfd = luna_sock_socket(s);
    if (a->lfd < 0 || luna_sock_bind(s, a->lfd, a->port) != 0 ||
        luna_sock_listen(s, a->lfd, 128) != 0 ||
        luna_sock_register(s, a->lfd, LUNA_POLLIN) != 0) {
        fprintf(stderr, "echo_batch: listen: %s\n", luna_last_error());
        a->errors++;
        luna_sock_request_stop(s);
    }
}

static void on_poll(luna_sockets_t *s, void *user) {
    struct app *a = user;
    luna_poll_event_t evs[64];
    static uint8_t buf[BUF];
    int n = luna_sock_poll(s, evs, 64);
    for (int i = 0; i < n; i++) {
        int fd = evs[i].fd;
        if (fd == a->lfd) {
            int c;
            while ((c = luna_sock_accept(s, a->lfd, NULL)) >= 0) {
                if (c >= MAX_FDS || luna_sock_register(s, c, LUNA_POLLIN) != 0) {
                    a->errors++;
                    luna_sock_close(s, c);
                }
            }
            continue;
        }
        struct sock *k = &a->socks[fd];
        if (evs[i].events & LUNA_POLLERR) {
            fprintf(stderr, "echo_batch: socket %d: %s\n", fd, strerror(evs[i].error));
            a->errors++;
            drop(s, a, fd);
            continue;
        }
        int f = flush(s, k, fd);
        if (f < 0) { a->errors++; drop(s, a, fd); continue; }
        if (f > 0) continue; /* still waiting for room: read no more */
        if (k->eof) { drop(s, a, fd); continue; }
        for (;;) {
            ptrdiff_t r = luna_sock_recv(s, fd, buf, sizeof buf);
            if (r > 0) {
                a->echoed += (unsigned long long)r;
                uint8_t *p = realloc(k->pending, k->len + (size_t)r);
                if (!p) { a->errors++; drop(s, a, fd); break; }
                memcpy(p + k->len, buf, (size_t)r);
                k->pending = p;
                k->len += (size_t)r;
                f = flush(s, k, fd);
                if (f < 0) { a->errors++; drop(s, a, fd); break; }
                if (f > 0) { luna_sock_register(s, fd, LUNA_POLLIN | LUNA_POLLOUT); break; }
                continue;
            }
            if (r == 0) { /* end of stream: close once everything is echoed */
                if (k->len == 0) drop(s, a, fd);
                else k->eof = 1;
                break;
            }
            if (errno == EAGAIN) { luna_sock_register(s, fd, LUNA_POLLIN); break; }
            fprintf(stderr, "echo_batch: recv: %s\n", luna_last_error());
            a->errors++;
            drop(s, a, fd);
            break;
        }
    }
}

int main(int argc, char **argv) {
    static struct app a;
    a.port = 7000;
    a.conns_target = 1;
    if (argc < 2) { fprintf(stderr, "usage: %s CONFIG.toml [--port P] [--conns N]\n", argv[0]); return 2; }
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) a.port = (uint16_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--conns")) a.conns_target = atol(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    luna_env_t *env = luna_init(argv[1], NULL, 0);
    if (!env) { fprintf(stderr, "echo_batch: luna_init: %s\n", luna_last_error()); return 1; }
    luna_batch_ops_t ops = {0};
    ops.on_start = on_start;
    ops.on_poll = on_poll;
    if (luna_env_cores(env) != 1) {
        fprintf(stderr, "echo_batch: one core only (its state is not per core)\n");
        return 1;
    }
    luna_runtime_t *rt = luna_run_batch(env, &ops, &a);
    if (!rt) { fprintf(stderr, "echo_batch: luna_run_batch: %s\n", luna_last_error()); return 1; }
    printf("ECHO_READY\n");
    fflush(stdout);
    struct timespec tick = {0, 5 * 1000 * 1000};
    for (int i = 0; i < 12000 && luna_runtime_finished(rt) == 0; i++) nanosleep(&tick, NULL);
    luna_runtime_stop(rt);
    if (luna_runtime_join(rt) != 0) {
        fprintf(stderr, "echo_batch: join: %s\n", luna_last_error());
        a.errors++;
    }
    printf("ECHO_RESULT echoed=%llu conns=%ld errors=%ld\n", a.echoed, a.conns_closed, a.errors);
    luna_runtime_free(rt);
    luna_env_free(env);
    return a.errors == 0 ? 0 : 1;
}
