// stdio on a connected TCP socket (fdopen), SIGPIPE left at its default (as most C programs).
// usage: stdio_sock PEER_IP   (kernel_peer.py: 9008 answers each line upper-cased)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9008)};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 2; }
    FILE *in = fdopen(s, "r"), *out = fdopen(dup(s), "w");
    fprintf(out, "hello over stdio\n");
    if (fflush(out)) perror("fflush");
    char line[100];
    alarm(5);
    if (fgets(line, sizeof line, in)) printf("reply: %s", line); else perror("fgets");
    return 0;
}
