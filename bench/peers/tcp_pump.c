/* tcp_pump: the TCP ceiling, on loopback or around a ring of hosts.
 *
 *   tcp_pump [MiB] [--json]
 *   tcp_pump --listen ADDR:PORT --to ADDR:PORT [MiB] [--json]
 *
 * Loopback (the first form): one TCP stream between two processes on
 * 127.0.0.1 carries MiB mebibytes (default 1024) in 4 MiB writes; the
 * receiver reads into a 4 MiB buffer until it has them all. Prints the
 * bandwidth (GB/s, 10^9 bytes) and the CPU-seconds (user + system, from
 * getrusage(RUSAGE_SELF)) per GB moved, of the sender, the receiver and the
 * two together.
 *
 * Loopback has no wire: the CPUs copy every byte into a socket buffer and
 * out again, so CPU-s per GB is what one byte of any TCP transport costs
 * here, before the transport does anything else with it. With C CPUs, a
 * ring allreduce on n ranks (each rank sends and receives 2(n-1)/n of the
 * buffer) is then bounded by busbw <= C / (n * cpu_s_per_gb).
 *
 * Ring (the second form, one process per host): streams MiB to --to while it
 * reads MiB from the one peer that connects to --listen, which is the
 * traffic of a ring allreduce (every host sends to the next and receives from
 * the one before, over one link each way) and nothing else: no steps, no
 * reductions. The bandwidth it prints is what TCP carries over this host's
 * incoming link while every link is loaded, the ceiling of an allreduce's
 * busbw on that wire (busbw counts the bytes each link carries). Connecting
 * retries for 30 s while the next host starts; every read and write gives
 * up after 30 s without progress.
 *
 * Both sides measure from the first byte to the last: the sender from
 * connect() until shutdown(), the receiver from accept() until it has read
 * everything. The bandwidth is the bytes over the receiver's time. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netdb.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK       (4u << 20)
#define RING_WAIT_S 30 /* connecting, accepting, and any read or write without progress */

struct side {
	double wall_s, cpu_s;
	uint64_t bytes;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads and writes that make no progress for RING_WAIT_S fail (EAGAIN). */
static void set_timeouts(int fd)
{
	struct timeval tv = {.tv_sec = RING_WAIT_S};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* ADDR:PORT (numeric IPv4) into sa; 0 when it parses. */
static int parse_addr(const char *arg, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(arg, ':');
	if (!colon || colon == arg || (size_t)(colon - arg) >= sizeof(host))
		return -1;
	memcpy(host, arg, (size_t)(colon - arg));
	host[colon - arg] = '\0';
	char *end;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (*end != '\0' || end == colon + 1 || port > 65535)
		return -1;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The receiver: accepts one connection on lfd, reads total bytes, writes
 * its figures to the pipe wfd. Returns the exit status. */
static int receiver(int lfd, uint64_t total, int wfd)
{
	char *buf = malloc(CHUNK);
	if (!buf)
		return 1;
	struct pollfd pfd = {.fd = lfd, .events = POLLIN};
	if (poll(&pfd, 1, RING_WAIT_S * 1000) != 1) {
		fprintf(stderr, "tcp_pump: receiver: no peer connected within %d s\n", RING_WAIT_S);
		return 1;
	}
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0) {
		perror("tcp_pump: accept");
		return 1;
	}
	set_timeouts(fd);
	struct side s = {0};
	double c0 = cpu_s(), t0 = now_s();
	while (s.bytes < total) {
		ssize_t r = read(fd, buf, CHUNK);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "tcp_pump: receiver: %s after %llu bytes\n",
			        r < 0 ? strerror(errno) : "EOF", (unsigned long long)s.bytes);
			return 1;
		}
		s.bytes += (uint64_t)r;
	}
	s.wall_s = now_s() - t0;
	s.cpu_s = cpu_s() - c0;
	close(fd);
	free(buf);
	return write(wfd, &s, sizeof(s)) == (ssize_t)sizeof(s) ? 0 : 1;
}

/* A connection to sa, retried for RING_WAIT_S while nobody listens there yet. */
static int connect_to(const struct sockaddr_in *sa)
{
	double until = now_s() + RING_WAIT_S;
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
			set_timeouts(fd);
			return fd;
		}
		int e = errno;
		close(fd);
		if ((e != ECONNREFUSED && e != EINTR) || now_s() > until) {
			errno = e;
			return -1;
		}
		struct timespec ts = {0, 20 * 1000 * 1000}; /* the next host is starting */
		nanosleep(&ts, NULL);
	}
}

static int sender(const struct sockaddr_in *sa, uint64_t total, struct side *s)
{
	char *buf = malloc(CHUNK);
	if (!buf)
		return 1;
	memset(buf, 0x5a, CHUNK); /* touch the pages before the clock starts */
	int fd = connect_to(sa);
	if (fd < 0) {
		perror("tcp_pump: connect");
		return 1;
	}
	double c0 = cpu_s(), t0 = now_s();
	while (s->bytes < total) {
		size_t want = total - s->bytes < CHUNK ? (size_t)(total - s->bytes) : CHUNK;
		size_t off = 0;
		while (off < want) {
			ssize_t w = write(fd, buf + off, want - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				perror("tcp_pump: write");
				return 1;
			}
			off += (size_t)w;
		}
		s->bytes += want;
	}
	shutdown(fd, SHUT_WR);
	s->wall_s = now_s() - t0;
	s->cpu_s = cpu_s() - c0;
	close(fd);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t mib = 1024;
	bool json = false, ring = false;
	struct sockaddr_in listen_sa, to_sa;
	memset(&listen_sa, 0, sizeof(listen_sa));
	listen_sa.sin_family = AF_INET;
	listen_sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	const char *usage = "usage: tcp_pump [--listen ADDR:PORT --to ADDR:PORT] [MiB (default "
	                    "1024)] [--json]\n";
	int have_listen = 0, have_to = 0;
	for (int i = 1; i < argc; i++) {
		char *end;
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
			continue;
		}
		if (strcmp(argv[i], "--listen") == 0 || strcmp(argv[i], "--to") == 0) {
			bool is_listen = argv[i][2] == 'l';
			if (i + 1 >= argc ||
			    parse_addr(argv[i + 1], is_listen ? &listen_sa : &to_sa)) {
				fprintf(stderr, "tcp_pump: %s needs a numeric ADDR:PORT\n%s",
				        argv[i], usage);
				return 2;
			}
			*(is_listen ? &have_listen : &have_to) = 1;
			i++;
			continue;
		}
		unsigned long long v = strtoull(argv[i], &end, 10);
		if (end == argv[i] || *end != '\0' || v == 0 || v > (1ull << 20)) {
			fprintf(stderr, "%s", usage);
			return 2;
		}
		mib = v;
	}
	if (have_listen != have_to) {
		fprintf(stderr, "tcp_pump: --listen and --to go together\n%s", usage);
		return 2;
	}
	ring = have_listen;
	uint64_t total = mib << 20;

	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = listen_sa;
	socklen_t len = sizeof(sa);
	int one = 1;
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 1) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &len) != 0) {
		perror("tcp_pump: listen");
		return 1;
	}
	if (ring)
		sa = to_sa;
	int pfd[2];
	if (pipe(pfd) != 0) {
		perror("tcp_pump: pipe");
		return 1;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("tcp_pump: fork");
		return 1;
	}
	if (pid == 0) {
		close(pfd[0]);
		_exit(receiver(lfd, total, pfd[1]));
	}
	close(pfd[1]);
	close(lfd);
	struct side snd = {0}, rcv = {0};
	int rc = sender(&sa, total, &snd);
	ssize_t got = read(pfd[0], &rcv, sizeof(rcv));
	int st;
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
	    got != (ssize_t)sizeof(rcv) || rcv.bytes != total)
		rc = 1;
	if (rc != 0) {
		fprintf(stderr, "tcp_pump: failed\n");
		return 1;
	}
	double gb = (double)total / 1e9;
	double gbps = gb / rcv.wall_s;
	double s_per_gb = snd.cpu_s / gb, r_per_gb = rcv.cpu_s / gb;
	if (json)
		printf("{\"mode\":\"%s\",\"bytes\":%llu,\"seconds\":%.6f,\"gbps\":%.4f,\"sender_"
		       "cpu_s_per_gb\":%."
		       "4f,"
		       "\"receiver_cpu_s_per_gb\":%.4f,\"cpu_s_per_gb\":%.4f}\n",
		       ring ? "ring" : "loopback", (unsigned long long)total, rcv.wall_s, gbps,
		       s_per_gb, r_per_gb, s_per_gb + r_per_gb);
	else
		printf("tcp_pump (%s): %llu bytes in %.3f s: %.4f GB/s; CPU-s per GB: sender %.3f, "
		       "receiver %.3f, together %.3f\n",
		       ring ? "ring" : "loopback", (unsigned long long)total, rcv.wall_s, gbps,
		       s_per_gb, r_per_gb, s_per_gb + r_per_gb);
	return 0;
}
