/* Fuzz target: the rendezvous server as a stray or hostile client sees it.
 * One server runs in this process for the whole session; every input is
 * written raw to a fresh connection, followed by a "GET /healthz ...
 * Connection: close" request, so that a well-formed input gets its answers
 * and then the close, and a malformed one its error. The harness reads until
 * the server closes or 300 ms pass (an input may hold a long poll), then
 * hangs up, as a client that goes away would.
 *
 * Checked: the server never crashes (ASan, UBSan), every answer it writes
 * starts as an HTTP/1.x status line and none is a 500, and after every 32
 * inputs, and at exit, it still answers /healthz 200 and a KV round trip within 5 s on a new
 * connection: no input can wedge it or break the store for other clients. */
#include "core.h"
#include "fuzz.h"
#include "rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN "fuzz-token"

static struct kolo_rdzv_server *server;
static int port;
static unsigned long inputs;
static unsigned long answers[6]; /* by the first digit of the first status; [0]: none */

static void stop_server(void)
{
	kolo_rdzv_server_stop(server);
	server = NULL;
}

static void start_server(void)
{
	struct kolo_rdzv_server_config cfg = {
	        .listen = "127.0.0.1:0",
	        .token = TOKEN,
	        .min_np = 1,
	        .max_np = 0,
	        .settle_ms = 20,
	        .lease_ms = 500,
	        .job_retain_ms = 1000,
	};
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_rdzv_server_start(&cfg, &server, &eb);
	FUZZ_CHECK(st == KOLO_OK, "server start: %s", eb.msg);
	port = kolo_rdzv_server_port(server);
	atexit(stop_server);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int connect_server(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(fd >= 0, "socket");
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	FUZZ_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect to the server");
	return fd;
}

/* Sends what it can; the server may close early on a bad request. */
static void send_all(int fd, const uint8_t *p, size_t n, uint64_t deadline)
{
	while (n > 0 && now_ms() < deadline) {
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		if (poll(&pf, 1, 50) <= 0)
			continue;
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k <= 0)
			return;
		p += k;
		n -= (size_t)k;
	}
}

/* Reads until EOF or the deadline into out (keeps the first size-1 bytes). */
static size_t recv_until(int fd, char *out, size_t size, uint64_t deadline, bool *eof)
{
	size_t got = 0;
	*eof = false;
	char sink[4096];
	for (uint64_t now; (now = now_ms()) < deadline;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, (int)(deadline - now)) <= 0)
			continue;
		ssize_t k = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
		if (k <= 0) {
			*eof = true;
			break;
		}
		size_t keep = got + (size_t)k < size - 1 ? (size_t)k : size - 1 - got;
		memcpy(out + got, sink, keep);
		got += keep;
	}
	out[got] = '\0';
	return got;
}

static void request(const char *req, char *resp, size_t size)
{
	int fd = connect_server();
	uint64_t deadline = now_ms() + 5000;
	send_all(fd, (const uint8_t *)req, strlen(req), deadline);
	bool eof;
	recv_until(fd, resp, size, deadline, &eof);
	close(fd);
	FUZZ_CHECK(eof, "no complete answer within 5 s after %lu inputs to: %.60s", inputs, req);
}

static void check_alive(void)
{
	char resp[2048];
	request("GET /healthz HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n", resp,
	        sizeof(resp));
	FUZZ_CHECK(!strncmp(resp, "HTTP/1.1 200", 12), "/healthz after %lu inputs: %.80s", inputs,
	           resp);
	char req[256];
	static const char kv[] = "%s /v1/jobs/probe/kv/k%lu HTTP/1.1\r\nHost: f\r\n"
	                         "Authorization: Bearer " TOKEN "\r\nConnection: close\r\n%s";
	snprintf(req, sizeof(req), kv, "PUT", inputs, "Content-Length: 5\r\n\r\nvalue");
	request(req, resp, sizeof(resp));
	FUZZ_CHECK(!strncmp(resp, "HTTP/1.1 204", 12), "KV put after %lu inputs: %.80s", inputs,
	           resp);
	snprintf(req, sizeof(req), kv, "GET", inputs, "\r\n");
	request(req, resp, sizeof(resp));
	const char *body = strstr(resp, "\r\n\r\n");
	FUZZ_CHECK(!strncmp(resp, "HTTP/1.1 200", 12) && body && !strcmp(body + 4, "value"),
	           "KV get after %lu inputs: %.120s", inputs, resp);
}

static void check_alive_at_exit(void)
{
	if (!server)
		return;
	check_alive();
	fprintf(stderr,
	        "fuzz_rdzv_http: %lu inputs; first answers 1xx %lu, 2xx %lu, 3xx %lu, 4xx %lu, "
	        "5xx %lu, none (dropped or held) %lu\n",
	        inputs, answers[1], answers[2], answers[3], answers[4], answers[5], answers[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!server) {
		start_server();
		atexit(check_alive_at_exit); /* runs before stop_server */
	}
	static const char tail[] = "GET /healthz HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n";
	int fd = connect_server();
	uint64_t deadline = now_ms() + 300;
	send_all(fd, data, size, deadline);
	send_all(fd, (const uint8_t *)tail, sizeof(tail) - 1, deadline);
	char resp[256];
	bool eof;
	size_t got = recv_until(fd, resp, sizeof(resp), deadline, &eof);
	close(fd);
	FUZZ_CHECK(got == 0 || !strncmp(resp, "HTTP/1.", got < 7 ? got : 7),
	           "an answer that is not HTTP: %.60s", resp);
	int cls = got >= 10 && resp[9] >= '1' && resp[9] <= '5' ? resp[9] - '0' : 0;
	answers[cls]++;
	/* 505 (bad HTTP version) and 503 (shutting down) are fine; a 500 would be
	 * the server failing on a client's input. */
	FUZZ_CHECK(cls != 5 || strncmp(resp + 9, "500", 3) != 0, "500 for: %.*s",
	           (int)(size < 200 ? size : 200), (const char *)data);
	if (++inputs % 32 == 0)
		check_alive();
	return 0;
}
