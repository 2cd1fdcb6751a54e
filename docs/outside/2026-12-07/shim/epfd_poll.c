// An epoll fd watched by poll(2) (an event loop embedded in another, e.g. libuv's
// uv_backend_fd or a GLib source on an epoll fd): with an idle luna socket in the set, how
// often does poll() on the epoll fd say "readable" in 2 s?  usage: epfd_poll PEER_IP
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9001)};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 2; }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, out[8];
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    int wakeups = 0, events = 0;
    double end = now() + 2;
    while (now() < end) {
        struct pollfd p = {.fd = ep, .events = POLLIN};
        if (poll(&p, 1, 500) > 0) {
            wakeups++;
            events += epoll_wait(ep, out, 8, 0);
        }
    }
    printf("poll(epfd) readable %d times in 2 s, epoll_wait found %d events (Linux: 0 and 0)\n", wakeups, events);
    return 0;
}
