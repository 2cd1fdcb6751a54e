// Edge semantics of a connected TCP socket, as Linux gives them. usage: edge PEER_IP
// Peer: kernel_peer.py (9001 echo, 9007 sends "late" after 1.5 s).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
static const char *peer;
static int conn(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, peer, &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a)) { perror("connect"); exit(2); }
    return s;
}
#define SHOW(name, expr) do { errno = 0; long r_ = (long)(expr); int e_ = errno; \
    printf("%-52s -> %ld%s%s\n", name, r_, r_ < 0 ? " errno=" : "", r_ < 0 ? strerrorname_np(e_) : ""); fflush(stdout); } while (0)
int main(int argc, char **argv) {
    peer = argv[1];
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IONBF, 0);
    char buf[64];

    // 1. nested epoll: an epoll set holding a socket, itself in an outer epoll set / poll
    {
        int s = conn(9007);
        int inner = epoll_create1(0), outer = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
        epoll_ctl(inner, EPOLL_CTL_ADD, s, &ev);
        ev.data.fd = inner;
        epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev);
        struct epoll_event out[4];
        SHOW("nested epoll: outer wait (data after 1.5s), 4s", epoll_wait(outer, out, 4, 4000));
        struct pollfd p = {.fd = inner, .events = POLLIN};
        SHOW("poll() on the inner epoll fd (data queued now)", poll(&p, 1, 1000));
        fd_set r; FD_ZERO(&r); FD_SET(inner, &r); struct timeval tv = {1, 0};
        SHOW("select() on the inner epoll fd", select(inner + 1, &r, NULL, NULL, &tv));
        SHOW("inner epoll_wait", epoll_wait(inner, out, 4, 0));
        close(s); close(inner); close(outer);
    }
    // 3. MSG_TRUNC on TCP: Linux discards the bytes and returns their count
    {
        int s = conn(9001);
        send(s, "abcdefgh", 8, 0); usleep(200000);
        SHOW("recv(NULL, 4, MSG_TRUNC)", recv(s, NULL, 4, MSG_TRUNC));
        SHOW("recv the rest", recv(s, buf, sizeof buf, MSG_DONTWAIT));
        buf[4] = 0; printf("   rest=%.4s (Linux: efgh)\n", buf);
        // 4. bad buffers: EFAULT on Linux
        send(s, "abcd", 4, 0); usleep(200000);
        if (getenv("EDGE_EFAULT")) {
            SHOW("write(s, (void*)8, 4)", write(s, (void *)8, 4));
            SHOW("read(s, (void*)8, 4) with bytes queued", read(s, (void *)8, 4));
        } else recv(s, buf, 4, 0);
        // 5. accept-ish address lengths
        struct sockaddr_in a; socklen_t l = 4;
        SHOW("getpeername len=4 (returns 0, len set to 16)", getpeername(s, (void *)&a, &l));
        printf("   len=%u\n", l);
        l = 0;
        SHOW("getsockname len=0", getsockname(s, (void *)&a, &l));
        printf("   len=%u\n", l);
        SHOW("getsockname NULL len ptr", getsockname(s, (void *)&a, NULL));
        // 6. poll with a negative fd and a luna fd
        struct pollfd p[2] = {{.fd = -1, .events = POLLIN}, {.fd = s, .events = POLLOUT}};
        SHOW("poll({-1, s POLLOUT})", poll(p, 2, 100));
        printf("   revents: %#x %#x\n", p[0].revents, p[1].revents);
        // 7. epoll_ctl errors
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN};
        SHOW("epoll_ctl ADD", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
        SHOW("epoll_ctl ADD again (EEXIST)", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
        SHOW("epoll_ctl DEL", epoll_ctl(ep, EPOLL_CTL_DEL, s, &ev));
        SHOW("epoll_ctl DEL again (ENOENT)", epoll_ctl(ep, EPOLL_CTL_DEL, s, &ev));
        SHOW("epoll_ctl MOD unregistered (ENOENT)", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
        SHOW("epoll_ctl ADD to a non-epoll fd (EINVAL)", epoll_ctl(s, EPOLL_CTL_ADD, 0, &ev));
        SHOW("epoll_ctl ADD luna socket to bad epfd (EBADF)", epoll_ctl(999, EPOLL_CTL_ADD, s, &ev));
        SHOW("epoll_wait on luna socket as epfd (EINVAL)", epoll_wait(s, &ev, 1, 0));
        // 8. ops that make no sense on a stream socket
        SHOW("lseek (ESPIPE)", lseek(s, 0, SEEK_SET));
        SHOW("pread (ESPIPE)", pread(s, buf, 4, 0));
        SHOW("listen on a connected socket (EINVAL)", listen(s, 5));
        struct sockaddr_in b = {.sin_family = AF_INET};
        SHOW("bind on a connected socket (EINVAL)", bind(s, (void *)&b, sizeof b));
        SHOW("accept on a connected socket (EINVAL)", accept(s, NULL, NULL));
        SHOW("send MSG_OOB 1 byte", send(s, "!", 1, MSG_OOB));
        SHOW("setsockopt SO_RCVLOWAT 4", setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &(int){4}, sizeof(int)));
        send(s, "xy", 2, 0); usleep(200000);
        struct pollfd q = {.fd = s, .events = POLLIN};
        SHOW("poll with 2 bytes < SO_RCVLOWAT 4 (Linux 0)", poll(&q, 1, 100));
        close(s); close(ep);
    }
    // 9. recv on a closed descriptor number, and double close
    {
        int s = conn(9001);
        close(s);
        SHOW("recv after close (EBADF)", recv(s, buf, 4, MSG_DONTWAIT));
        SHOW("close again (EBADF)", close(s));
    }
    // 10. shutdown then poll: SHUT_RDWR gives POLLHUP; write after SHUT_WR is EPIPE
    {
        int s = conn(9001);
        shutdown(s, SHUT_WR);
        usleep(200000);
        struct pollfd q = {.fd = s, .events = POLLIN | POLLOUT | POLLRDHUP};
        SHOW("poll after SHUT_WR, peer echoes FIN", poll(&q, 1, 100));
        printf("   revents %#x (Linux: POLLIN|POLLOUT|POLLRDHUP|POLLHUP = 0x2015)\n", q.revents);
        close(s);
    }
    // 2. stdio on a socket: fdopen + fprintf/fgets (glibc's stdio calls its internal write/read)
    {
        int s = conn(9001);
        FILE *f = fdopen(s, "r+");
        setvbuf(f, NULL, _IOLBF, 0);
        int w = fprintf(f, "hello stdio\n"); fflush(f);
        printf("%-52s -> %d ferror=%d\n", "fdopen: fprintf+fflush", w, ferror(f));
        alarm(5);
        char *g = fgets(buf, sizeof buf, f);
        alarm(0);
        printf("%-52s -> %s", "fdopen: fgets the echo", g ? g : "(NULL)\n");
        // no fclose: glibc's internal close would bypass the shim (documented)
    }
    return 0;
}
