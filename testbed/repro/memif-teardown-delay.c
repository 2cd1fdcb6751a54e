/* Test aid for testbed/repro/memif-teardown.sh (LD_PRELOAD), not part of any build.
 * Widens DPDK memif's teardown race window: once the link's client has announced it
 * stopped polling (r2c's quiescence marker "<socket>.quiet-client", the socket taken
 * from the process's --vdev argument), recvmsg on the EAL interrupt thread (memif's
 * control-channel callback, already marked active) first sleeps ZCSEGV_DELAY_US. Each
 * delay is also appended to the file $ZCSEGV_LOG, if set. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char marker[512];

static void find_marker(void)
{
	char buf[8192];
	int fd = open("/proc/self/cmdline", O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return;
	buf[n] = 0;
	for (ssize_t i = 0; i < n; i++)
		if (buf[i] == 0)
			buf[i] = ' ';
	char *s = strstr(buf, "socket=");
	if (!s)
		return;
	s += 7;
	size_t len = strcspn(s, ", ");
	snprintf(marker, sizeof(marker), "%.*s.quiet-client", (int)len, s);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	static ssize_t (*real)(int, struct msghdr *, int);
	char name[32] = "";
	if (!real)
		real = dlsym(RTLD_NEXT, "recvmsg");
	pthread_getname_np(pthread_self(), name, sizeof(name));
	const char *d = getenv("ZCSEGV_DELAY_US");
	if (d && strncmp(name, "eal-intr", 8) == 0) {
		if (!marker[0])
			find_marker();
		if (marker[0] && access(marker, F_OK) == 0) {
			const char *log = getenv("ZCSEGV_LOG");
			FILE *f = log ? fopen(log, "a") : NULL;

			fprintf(stderr, "zcsegv-delay: intr-thread recvmsg delayed %s us\n", d);
			if (f) { /* the script counts the delays it injected */
				fprintf(f, "%d delayed %s us\n", (int)getpid(), d);
				fclose(f);
			}
			usleep(atoi(d));
		}
	}
	return real(fd, msg, flags);
}
