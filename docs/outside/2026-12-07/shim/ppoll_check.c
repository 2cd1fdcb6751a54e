// ppoll(2) on a connected luna socket with nothing to read: Linux waits for the timeout
// (revents 0); the luna shim forwards ppoll to the kernel placeholder.
// usage: ppoll_check PEER_IP PORT   (PORT: a server that sends nothing at first, e.g. 9007)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 2; }
    struct pollfd p = {.fd = s, .events = POLLIN};
    struct timespec ts = {0, 500 * 1000 * 1000};
    int r = poll(&p, 1, 500);
    printf("poll : r=%d revents=%#x\n", r, p.revents);
    p.revents = 0;
    r = ppoll(&p, 1, &ts, NULL);
    printf("ppoll: r=%d revents=%#x%s%s\n", r, p.revents, p.revents & POLLHUP ? " POLLHUP" : "",
           p.revents & POLLIN ? " POLLIN" : "");
    char b[16];
    ssize_t n = recv(s, b, sizeof b, MSG_DONTWAIT);
    printf("recv after ppoll: %zd %s\n", n, n < 0 ? strerror(errno) : "");
    p.revents = 0;
    r = ppoll(&p, 1, NULL, NULL);  // the data ("late") arrives after 1.5 s
    n = recv(s, b, sizeof b, MSG_DONTWAIT);
    printf("ppoll(no timeout): r=%d revents=%#x, then recv %zd\n", r, p.revents, n);
    return 0;
}
