// usage: nested PEER_IP  (kernel_peer.py: 9007 sends "late" 1.5 s after accept, 9001 echo)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static const char *peer;
static double t0;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9 - t0; }
static int conn(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, peer, &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a)) { printf("connect fd %d: %s\n", s, strerrorname_np(errno)); return -1; }
    return s;
}
int main(int argc, char **argv) {
    peer = argv[1]; t0 = now();
    int mode = argc > 2 ? atoi(argv[2]) : 0;
    int s = conn(9007);
    int inner = epoll_create1(0), outer = epoll_create1(0);
    printf("s=%d inner=%d outer=%d\n", s, inner, outer);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out[4];
    epoll_ctl(inner, EPOLL_CTL_ADD, s, &ev);
    if (mode == 0) {
        ev.data.fd = inner;
        epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev);
        for (int i = 0; i < 3; i++) {
            double t = now();
            int r = epoll_wait(outer, out, 4, 3000);
            int r2 = epoll_wait(inner, out, 4, 0);
            printf("[%.2f] outer epoll_wait -> %d after %.2f s; inner epoll_wait(0) -> %d\n", now(), r, now() - t, r2);
            if (r2 > 0) break;
        }
    }
    printf("close s=%d -> %d\n", s, close(s));
    printf("close inner -> %d, close outer -> %d\n", close(inner), close(outer));
    int s2 = conn(9001);
    printf("new socket connected: fd %d\n", s2);
    return 0;
}
